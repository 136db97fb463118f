DROP TABLE "app"."example_jobs_p20261124"
