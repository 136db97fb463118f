SELECT "j"."status"::text AS "state", count(*)::bigint AS "count" FROM "app"."example_jobs" AS "j" WHERE "j"."workflow_id" = $1 AND "j"."task_name" NOT IN ($2, $3, $4) GROUP BY 1
