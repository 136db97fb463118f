DELETE FROM "dbworker_nodes" WHERE "heartbeat_at" < now() - (make_interval(secs => $1::float8))
