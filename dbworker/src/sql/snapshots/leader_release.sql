DELETE FROM "dbworker_leaders" WHERE "scope" = $1 AND "node_id" = $2
