SELECT "consumer_name" FROM "dbworker_consumer_assignments" WHERE "node_id" = $1
