SELECT to_jsonb("example_jobs") AS "row" FROM "app"."example_jobs" AS "example_jobs" WHERE "example_jobs"."id" = $1
