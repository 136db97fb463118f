DELETE FROM "example_jobs_fair_weights" WHERE "fair_key" = $1
