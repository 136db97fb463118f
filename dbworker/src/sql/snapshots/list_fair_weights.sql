SELECT "fair_key", "weight" FROM "example_jobs_fair_weights" ORDER BY "fair_key" ASC
