UPDATE "example_jobs" AS "j" SET "status" = $1, "finished_at" = clock_timestamp() WHERE "j"."id" = $2 AND "j"."status" = $3 AND ((EXTRACT(EPOCH FROM "j"."started_at") * 1000000)::bigint) = $4
