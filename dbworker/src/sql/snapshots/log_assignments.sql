SELECT "consumer_name", "node_id" FROM "dbworker_consumer_assignments" ORDER BY "consumer_name" ASC
