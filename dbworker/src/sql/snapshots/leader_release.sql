UPDATE "dbworker_leaders" SET "expires_at" = now() WHERE "scope" = $1 AND "node_id" = $2 AND "term" = $3
