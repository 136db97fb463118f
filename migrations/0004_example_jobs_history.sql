-- The job history the dashboard's charts and `dbworker top` read, written by
-- dbworker::history::History (dbworker migration --table example_jobs --history):
-- the index over finished_at it aggregates through, and the history table.
-- Retention: the purger deletes old finished rows by finished_at.
CREATE INDEX IF NOT EXISTS "example_jobs_finished_idx" ON "example_jobs" ("finished_at") WHERE "state" IN ('completed', 'failed', 'canceled');

-- Finished jobs per job table, queue ('' without a queue column) and bucket:
-- a minute (seconds = 60), or an hour (3600) once downsampled. Counts and
-- sums are exact; an hour's percentiles are its minutes' weighted by "timed".
-- Times in seconds: wait from due (queued_at or process_after) to start, run
-- from start to finish, of the jobs that started ("timed").
CREATE TABLE IF NOT EXISTS "dbworker_history" (
    "job_table" text NOT NULL,
    "queue" text NOT NULL,
    "bucket" timestamptz NOT NULL,
    "seconds" integer NOT NULL CHECK ("seconds" > 0),
    "completed" bigint NOT NULL DEFAULT 0,
    "failed" bigint NOT NULL DEFAULT 0,
    "canceled" bigint NOT NULL DEFAULT 0,
    "retried" bigint NOT NULL DEFAULT 0,
    "timed" bigint NOT NULL DEFAULT 0,
    "wait_p50" double precision,
    "wait_p95" double precision,
    "wait_max" double precision,
    "wait_sum" double precision NOT NULL DEFAULT 0,
    "run_p50" double precision,
    "run_p95" double precision,
    "run_max" double precision,
    "run_sum" double precision NOT NULL DEFAULT 0,
    PRIMARY KEY ("job_table", "queue", "bucket", "seconds")
);
CREATE INDEX IF NOT EXISTS "dbworker_history_bucket_idx" ON "dbworker_history" ("job_table", "bucket");
