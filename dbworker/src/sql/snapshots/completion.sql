UPDATE "example_jobs" AS "j" SET "state" = $1 WHERE "j"."id" = $2 AND "j"."status" = ('processing') AND ((EXTRACT(EPOCH FROM "j"."started_at") * 1000000)::bigint) = $3
