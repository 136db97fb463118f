SELECT set_config($1, $2, TRUE) AS "idle_limit" FROM "dbworker_leaders" WHERE "scope" = $3 AND "node_id" = $4 AND "term" = $5 AND "expires_at" > clock_timestamp() FOR SHARE
