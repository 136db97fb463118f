DELETE FROM "dbworker_consumer_members" WHERE "group_name" = $1 AND "node_id" = $2
