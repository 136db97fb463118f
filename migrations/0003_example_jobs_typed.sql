-- The columns typed jobs need (dbworker migration --table example_jobs --typed):
-- example_jobs has its payload column from 0001, so only `kind` is new here.
-- Job kinds: one table, a handler per kind (workerutil::KindRegistry).
ALTER TABLE "example_jobs" ADD COLUMN IF NOT EXISTS "kind" text NOT NULL DEFAULT 'default';
-- Typed jobs' arguments as JSON: JobTableOptions::payload_column = Some("payload").
ALTER TABLE "example_jobs" ADD COLUMN IF NOT EXISTS "payload" jsonb NOT NULL DEFAULT '{}';
