INSERT INTO "dbworker_consumer_members" ("group_name", "node_id", "heartbeat_at") VALUES ($1, $2, now()) ON CONFLICT ("group_name", "node_id") DO UPDATE SET "heartbeat_at" = now()
