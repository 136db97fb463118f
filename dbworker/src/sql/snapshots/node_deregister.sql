DELETE FROM "dbworker_nodes" WHERE "id" = $1
