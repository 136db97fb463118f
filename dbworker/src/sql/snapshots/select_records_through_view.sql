SELECT "v".*, "v"."id"::bigint AS "dbworker_record_id" FROM "example_jobs_with_repository_name" AS "v" WHERE "v"."id" = ANY($1::bigint[])
