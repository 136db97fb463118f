EXPLAIN INSERT INTO "app"."example_jobs" AS "dbworker_job" ("job_key") VALUES (NULL) ON CONFLICT ("job_key") WHERE "status" IN ('queued', 'errored', 'processing') DO NOTHING
