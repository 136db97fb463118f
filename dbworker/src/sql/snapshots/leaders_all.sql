SELECT "scope", "node_id", "term", "expires_at" > now() AS "held" FROM "dbworker_leaders" ORDER BY "scope" ASC
