INSERT INTO "app"."example_jobs" AS "dbworker_job" ("process_after", "queue", "kind", "args") VALUES (DEFAULT, $1, $2, $3) RETURNING "dbworker_job"."id"::bigint AS "id"
