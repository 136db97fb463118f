-- The reference job table used by the examples (usable with `sqlx::migrate!`).
-- Generate one for your own table with `cargo run -p dbworker-cli -- migration --table NAME`.
CREATE TABLE IF NOT EXISTS "example_jobs" (
    "id" bigserial PRIMARY KEY,
    "state" text NOT NULL DEFAULT 'queued',
    "failure_message" text,
    "queued_at" timestamptz NOT NULL DEFAULT now(),
    "started_at" timestamptz,
    "finished_at" timestamptz,
    "process_after" timestamptz,
    "num_resets" integer NOT NULL DEFAULT 0,
    "num_failures" integer NOT NULL DEFAULT 0,
    "last_heartbeat_at" timestamptz,
    "execution_logs" json[],
    "worker_hostname" text NOT NULL DEFAULT '',
    "cancel" boolean NOT NULL DEFAULT false,
    -- Application columns: anything the handler needs.
    "payload" jsonb NOT NULL DEFAULT '{}',
    "cost" integer NOT NULL DEFAULT 0
);

-- The claim scans eligible rows in id order; a partial index keeps it small.
CREATE INDEX IF NOT EXISTS "example_jobs_dequeue_idx" ON "example_jobs" ("id") WHERE "state" IN ('queued', 'errored');
-- The resetter looks only at processing rows. Keyed on id, not the heartbeat
-- column, so heartbeats stay HOT updates.
CREATE INDEX IF NOT EXISTS "example_jobs_processing_idx" ON "example_jobs" ("id") WHERE "state" = 'processing';
-- Claims leave dead index entries behind; vacuum this table often.
ALTER TABLE "example_jobs" SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
