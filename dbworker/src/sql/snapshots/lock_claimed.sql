SELECT "j"."id" AS "id" FROM "example_jobs" AS "j" WHERE "j"."id" = $1 AND "j"."status" = ('processing') AND ((EXTRACT(EPOCH FROM "j"."started_at") * 1000000)::bigint) = $2 FOR KEY SHARE OF "j"
