ALTER TABLE "app"."example_jobs" DETACH PARTITION "app"."example_jobs_p20261124"
