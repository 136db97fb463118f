DELETE FROM "dbworker_limits" AS "dbworker_limits" WHERE "dbworker_limits"."job_table" = $1 AND "dbworker_limits"."queue" = $2
