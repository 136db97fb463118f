DELETE FROM "dbworker_pauses" AS "dbworker_pauses" WHERE "dbworker_pauses"."job_table" = $1 AND "dbworker_pauses"."queue" = $2 RETURNING "queue"
