UPDATE "app"."example_jobs" AS "j" SET "status" = 'canceled', "finished_at" = clock_timestamp(), "blocked_by" = $1, "failure_message" = $2 WHERE "j"."id" = $3 AND "j"."status" = ('pending')
