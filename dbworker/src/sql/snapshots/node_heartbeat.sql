INSERT INTO "dbworker_nodes" ("id", "host", "pid", "version", "queues", "handlers") VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT ("id") DO UPDATE SET "heartbeat_at" = now()
