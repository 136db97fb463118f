INSERT INTO "example_jobs_fair_weights" ("fair_key", "weight") VALUES ($1, $2) ON CONFLICT ("fair_key") DO UPDATE SET "weight" = "excluded"."weight"
