SELECT to_jsonb("example_jobs") AS "row", EXTRACT(EPOCH FROM now())::float8 AS "now" FROM "app"."example_jobs" AS "example_jobs" WHERE "example_jobs"."id" = $1
