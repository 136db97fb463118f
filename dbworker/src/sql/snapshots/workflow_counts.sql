SELECT "j"."status"::text AS "state", count(*)::bigint AS "count" FROM "app"."example_jobs" AS "j" WHERE "j"."workflow_id" = $1 GROUP BY 1 ORDER BY 1 ASC
