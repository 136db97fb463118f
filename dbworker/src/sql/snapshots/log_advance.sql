UPDATE "dbworker_consumer_checkpoints" SET "last_position" = $1, "updated_at" = now() WHERE "consumer_name" = $2 AND "last_position" = $3
