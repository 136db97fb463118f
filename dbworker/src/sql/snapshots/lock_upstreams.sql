SELECT "j"."id"::bigint AS "id", "j"."status"::text AS "state" FROM "app"."example_jobs" AS "j" WHERE "j"."id" = ANY($1::bigint[]) ORDER BY "j"."id" ASC FOR SHARE
