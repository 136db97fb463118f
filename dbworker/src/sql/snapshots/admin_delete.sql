DELETE FROM "app"."example_jobs" AS "example_jobs" WHERE ("example_jobs"."id" = ANY($1::bigint[])) AND "example_jobs"."status" <> ('processing')
