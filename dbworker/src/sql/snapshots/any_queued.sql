SELECT EXISTS(SELECT $1 FROM "example_jobs" AS "j" WHERE "j"."status" IN ('queued', 'errored') LIMIT $2)
