DELETE FROM "dbworker_history" WHERE "job_table" = $1 AND "bucket" < now() - $2 * interval '1 second'
