INSERT INTO "app"."archive" ("id", "state") SELECT "id", "state" FROM "app"."example_jobs_p20261124"
