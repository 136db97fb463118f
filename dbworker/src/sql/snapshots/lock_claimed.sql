SELECT $1 FROM "example_jobs" AS "j" WHERE "j"."id" = $2 AND "j"."status" = $3 AND ((EXTRACT(EPOCH FROM "j"."started_at") * 1000000)::bigint) = $4 FOR KEY SHARE OF "j"
