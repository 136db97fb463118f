UPDATE "dbworker_leaders" SET "expires_at" = now() + (make_interval(secs => $1::float8)) WHERE "scope" = $2 AND "node_id" = $3 AND "term" = $4 RETURNING "term"
