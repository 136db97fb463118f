DELETE FROM "app"."example_jobs" AS "example_jobs" WHERE "example_jobs"."job_key" = $1 AND "example_jobs"."status" IN ('queued', 'errored') RETURNING "example_jobs"."id"::bigint AS "id"
