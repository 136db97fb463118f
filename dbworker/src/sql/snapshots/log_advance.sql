UPDATE "dbworker_consumer_checkpoints" SET "last_position" = $3, "updated_at" = now() WHERE "consumer_name" = $1 AND "last_position" = $2
