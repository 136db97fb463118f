INSERT INTO "dbworker_nodes" ("id", "host", "pid", "version", "queues", "handlers", "honours") VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT ("id") DO UPDATE SET "heartbeat_at" = now()
