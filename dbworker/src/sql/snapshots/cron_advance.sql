UPDATE "dbworker_cron" AS "dbworker_cron" SET "last_tick" = timestamptz 'epoch' + $1::bigint * interval '1 microsecond' WHERE "dbworker_cron"."job_table" = $2 AND "dbworker_cron"."schedule" = $3
