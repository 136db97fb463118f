SELECT "j".*, "j"."id"::bigint AS "dbworker_record_id" FROM "example_jobs" AS "j" WHERE "j"."id" = ANY($1::bigint[])
