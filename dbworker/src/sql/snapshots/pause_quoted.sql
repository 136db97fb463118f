INSERT INTO "pause" AS "pause" ("job_table", "queue", "paused_by") VALUES ($1, $2, $3) ON CONFLICT ("job_table", "queue") DO NOTHING RETURNING "queue"
