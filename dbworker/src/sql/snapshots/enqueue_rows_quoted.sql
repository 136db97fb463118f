INSERT INTO "order" AS "dbworker_job" ("process_after", "payload") VALUES (DEFAULT, $1) RETURNING "dbworker_job"."id"::bigint AS "id"
