SELECT "consumer_name", "node_id" FROM "dbworker_consumer_assignments" ORDER BY 1
