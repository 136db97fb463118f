SELECT "node_id" FROM "dbworker_leaders" WHERE "scope" = $1 AND "expires_at" > now()
