SELECT 1 AS "owned" FROM "dbworker_consumer_assignments" WHERE "consumer_name" = $1 AND "node_id" = $2 FOR UPDATE
