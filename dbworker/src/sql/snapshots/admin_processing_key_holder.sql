SELECT "example_jobs"."id"::bigint AS "id" FROM "app"."example_jobs" AS "example_jobs" WHERE "example_jobs"."job_key" = $1 AND "example_jobs"."status" = ('processing') LIMIT $2
