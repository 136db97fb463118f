INSERT INTO "app"."archive" SELECT * FROM "app"."example_jobs_p20261124"
