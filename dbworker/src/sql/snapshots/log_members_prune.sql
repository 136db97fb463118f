DELETE FROM "dbworker_consumer_members" WHERE "group_name" = $1 AND "heartbeat_at" < now() - (make_interval(secs => $2::float8))
