UPDATE "app"."example_jobs" AS "example_jobs" SET "cancel" = $1 WHERE ("example_jobs"."id" = ANY($2::bigint[])) AND "example_jobs"."status" IN ('processing')
