UPDATE "dbworker_consumer_checkpoints" SET "last_xid" = CAST(CAST($1 AS text) AS xid8), "last_position" = $2, "updated_at" = now() WHERE "consumer_name" = $3 AND "last_position" = $4
