INSERT INTO "dbworker_pauses" AS "dbworker_pauses" ("job_table", "queue", "paused_by") VALUES ($1, $2, $3) ON CONFLICT ("job_table", "queue") DO NOTHING RETURNING "queue"
