SELECT EXISTS(SELECT $1 FROM "example_jobs_signals" AS "dbworker_signal" WHERE "dbworker_signal"."job_id" = $2 AND "dbworker_signal"."name" = $3 AND "dbworker_signal"."consumed_at" IS NULL) AS "sent"
