UPDATE "app"."example_jobs" AS "j" SET "has_dependents" = $1 WHERE ("j"."id" = ANY($2::bigint[])) AND (NOT "j"."has_dependents")
