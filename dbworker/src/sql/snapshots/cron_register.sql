INSERT INTO "dbworker_cron" AS "dbworker_cron" ("job_table", "schedule", "last_tick") VALUES ($1, $2, clock_timestamp()) ON CONFLICT ("job_table", "schedule") DO NOTHING
