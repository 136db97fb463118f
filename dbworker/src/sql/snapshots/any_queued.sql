SELECT EXISTS(SELECT $1 FROM "example_jobs" AS "j" WHERE "j"."status" IN ($2, $3) LIMIT $4)
