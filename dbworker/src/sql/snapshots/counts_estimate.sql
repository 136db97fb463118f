EXPLAIN (FORMAT JSON) SELECT 1 FROM "app"."example_jobs" AS "example_jobs" WHERE "example_jobs"."status" = 'completed'
