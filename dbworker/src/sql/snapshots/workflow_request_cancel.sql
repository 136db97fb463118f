UPDATE "app"."example_jobs" AS "j" SET "cancel" = $1 WHERE "j"."workflow_id" = $2 AND "j"."status" = ('processing')
