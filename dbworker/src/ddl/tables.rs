//! The shared control tables (pauses, limits, cron, the node registry, leader
//! leases, the job history) and the log consumers' tables: one generator each.

use crate::columns::{Relation, quote};
use crate::error::{Error, Result};

/// `CREATE TABLE` for a pause table (`dbworker migration --pauses`); one pause
/// table serves every job table.
///
/// ```
/// let ddl = dbworker::ddl::pause_table_sql(dbworker::control::DEFAULT_PAUSE_TABLE).unwrap();
/// assert!(ddl.contains("PRIMARY KEY (\"job_table\", \"queue\")"));
/// ```
pub fn pause_table_sql(pause_table: &str) -> Result<String> {
    let rel = Relation::parse("pause_table", pause_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- Paused job tables (queue '*') and queues; claims skip them while paused.
CREATE TABLE IF NOT EXISTS {table} (
    "job_table" text NOT NULL,
    "queue" text NOT NULL,
    "paused_at" timestamptz NOT NULL DEFAULT now(),
    "paused_by" text NOT NULL DEFAULT '',
    PRIMARY KEY ("job_table", "queue")
);
"#
    ))
}

/// `CREATE TABLE` for a limit table (`dbworker migration --limits`); one limit
/// table serves every job table.
///
/// ```
/// let ddl = dbworker::ddl::limit_table_sql(dbworker::control::DEFAULT_LIMIT_TABLE).unwrap();
/// assert!(ddl.contains("\"max_per_key\" integer"));
/// ```
pub fn limit_table_sql(limit_table: &str) -> Result<String> {
    let rel = Relation::parse("limit_table", limit_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- Per queue, across every process: at most max_processing jobs processing,
-- at most max_per_key of them with one value of the store's limit_key_column,
-- and at most rate_per_second jobs started per second (a token bucket holding
-- up to burst). NULL: no such limit. tokens and refilled_at belong to the claim.
CREATE TABLE IF NOT EXISTS {table} (
    "job_table" text NOT NULL,
    "queue" text NOT NULL,
    "max_processing" integer CHECK ("max_processing" >= 0),
    "max_per_key" integer CHECK ("max_per_key" >= 0),
    "rate_per_second" double precision CHECK ("rate_per_second" > 0),
    "burst" integer CHECK ("burst" >= 1),
    "tokens" double precision NOT NULL DEFAULT 0,
    "refilled_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("job_table", "queue")
);
"#
    ))
}

/// `CREATE TABLE` for the cron table (`dbworker migration --cron`): the last
/// tick enqueued per schedule, shared by every scheduler process, and what
/// the dashboard's cron page shows (each schedule's expression, time zone
/// and last job). The `ALTER TABLE`s bring a table made by an earlier
/// version up to date; on a new one they do nothing.
///
/// ```
/// let ddl = dbworker::ddl::cron_table_sql(dbworker::cron::DEFAULT_CRON_TABLE).unwrap();
/// assert!(ddl.contains("\"last_tick\" timestamptz NOT NULL"));
/// assert!(ddl.contains("ADD COLUMN IF NOT EXISTS \"time_zone\" text"));
/// ```
pub fn cron_table_sql(cron_table: &str) -> Result<String> {
    let rel = Relation::parse("cron_table", cron_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- The last tick enqueued per cron schedule; every scheduler advances it atomically.
-- expression, time_zone and last_job_id are what the dashboard's cron page shows.
CREATE TABLE IF NOT EXISTS {table} (
    "job_table" text NOT NULL,
    "schedule" text NOT NULL,
    "last_tick" timestamptz NOT NULL,
    "expression" text,
    "time_zone" text,
    "last_job_id" bigint,
    PRIMARY KEY ("job_table", "schedule")
);
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "expression" text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "time_zone" text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "last_job_id" bigint;
"#
    ))
}

/// `CREATE TABLE` for the history table (`dbworker migration --history`):
/// finished jobs per job table, queue and minute (hour, once downsampled),
/// written by [`History`](crate::history::History); one history table serves
/// every job table.
///
/// ```
/// let ddl = dbworker::ddl::history_table_sql(dbworker::history::DEFAULT_HISTORY_TABLE).unwrap();
/// assert!(ddl.contains("PRIMARY KEY (\"job_table\", \"queue\", \"bucket\", \"seconds\")"));
/// ```
pub fn history_table_sql(history_table: &str) -> Result<String> {
    let rel = Relation::parse("history_table", history_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- Finished jobs per job table, queue ('' without a queue column) and bucket:
-- a minute (seconds = 60), or an hour (3600) once downsampled. Counts and
-- sums are exact; an hour's percentiles are its minutes' weighted by "timed".
-- Times in seconds: wait from due (queued_at or process_after) to start, run
-- from start to finish, of the jobs that started ("timed").
CREATE TABLE IF NOT EXISTS {table} (
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
CREATE INDEX IF NOT EXISTS {bucket_idx} ON {table} ("job_table", "bucket");
"#,
        bucket_idx = rel.quoted_derived("bucket_idx"),
    ))
}

/// `CREATE TABLE` for the registry (`dbworker migration --nodes`); one
/// registry serves every job table of the database.
///
/// ```
/// let ddl = dbworker::ddl::node_table_sql(dbworker::cluster::DEFAULT_NODE_TABLE).unwrap();
/// assert!(ddl.contains("\"heartbeat_at\" timestamptz NOT NULL"));
/// ```
pub fn node_table_sql(node_table: &str) -> Result<String> {
    let rel = Relation::parse("node_table", node_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- Worker processes: one row each, heartbeated; stale rows are dead processes.
CREATE TABLE IF NOT EXISTS {table} (
    "id" text PRIMARY KEY,
    "host" text NOT NULL,
    "pid" integer NOT NULL,
    "version" text NOT NULL,
    "queues" text[] NOT NULL DEFAULT '{{}}',
    "handlers" integer NOT NULL DEFAULT 0,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    "heartbeat_at" timestamptz NOT NULL DEFAULT now(),
    -- The control tables its workers honour (pauses, limits), for operators.
    "honours" text[] NOT NULL DEFAULT '{{}}'
);
-- A registry made before "honours" existed gets it (safe to rerun).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "honours" text[] NOT NULL DEFAULT '{{}}';
"#
    ))
}

/// `CREATE TABLE` for the lease table (`dbworker migration --nodes`).
///
/// ```
/// let ddl = dbworker::ddl::leader_table_sql(dbworker::cluster::DEFAULT_LEADER_TABLE).unwrap();
/// assert!(ddl.contains("\"expires_at\" timestamptz NOT NULL"));
/// ```
pub fn leader_table_sql(leader_table: &str) -> Result<String> {
    let rel = Relation::parse("leader_table", leader_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- One lease per scope (a job table, an application): who leads, until when.
CREATE TABLE IF NOT EXISTS {table} (
    "scope" text PRIMARY KEY,
    "node_id" text NOT NULL,
    -- Grows by one at each new leadership; a leader's writes are fenced by it.
    "term" bigint NOT NULL DEFAULT 1,
    "acquired_at" timestamptz NOT NULL DEFAULT now(),
    "expires_at" timestamptz NOT NULL
);
"#
    ))
}

/// `CREATE TABLE` for the consumers' assignments, checkpoints and group
/// members (`dbworker migration --consumers`; safe to rerun, which adds the
/// members table to an installation made before it existed). The members
/// table sits beside the assignment table, named after it (`…_assignments`
/// becomes `…_members`; any other name gets `_members` appended).
///
/// ```
/// let ddl = dbworker::ddl::consumer_tables_sql(
///     dbworker::consumers::DEFAULT_ASSIGNMENT_TABLE,
///     dbworker::consumers::DEFAULT_CHECKPOINT_TABLE,
/// ).unwrap();
/// assert!(ddl.contains("\"last_position\" bigint NOT NULL"));
/// ```
pub fn consumer_tables_sql(assignment_table: &str, checkpoint_table: &str) -> Result<String> {
    let a = Relation::parse("assignment_table", assignment_table)?.quoted();
    let c = Relation::parse("checkpoint_table", checkpoint_table)?.quoted();
    let m = crate::consumers::rebalance::member_table(&Relation::parse(
        "assignment_table",
        assignment_table,
    )?)
    .quoted();
    Ok(format!(
        r#"-- Which process runs each consumer (written by the leader).
CREATE TABLE IF NOT EXISTS {a} (
    "consumer_name" text PRIMARY KEY,
    "node_id" text NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    "updated_at" timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {a_idx} ON {a} ("node_id");
-- The last event each consumer has processed, in reading order: its writing
-- transaction, then its position.
CREATE TABLE IF NOT EXISTS {c} (
    "consumer_name" text PRIMARY KEY,
    "last_xid" xid8 NOT NULL DEFAULT '0',
    "last_position" bigint NOT NULL DEFAULT 0,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    "updated_at" timestamptz NOT NULL DEFAULT now()
);
-- Which processes run each group, each keeping its row fresh: the leader
-- deals a group's consumers only over these.
CREATE TABLE IF NOT EXISTS {m} (
    "group_name" text NOT NULL,
    "node_id" text NOT NULL,
    "heartbeat_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("group_name", "node_id")
);
"#,
        a_idx = quote(&format!(
            "{}_node_idx",
            Relation::parse("assignment_table", assignment_table)?.name
        )),
    ))
}

/// `CREATE TABLE` for a plain events table, with a trigger that NOTIFYs
/// `channel` once per inserting statement (for `LogOptions::listen`).
///
/// ```
/// let ddl = dbworker::ddl::events_table_sql("events", "events_appended").unwrap();
/// assert!(ddl.contains("\"global_position\" bigserial PRIMARY KEY"));
/// ```
pub fn events_table_sql(events_table: &str, channel: &str) -> Result<String> {
    let rel = Relation::parse("events_table", events_table)?;
    if !crate::columns::is_identifier(channel) {
        return Err(Error::InvalidOption {
            field: "channel",
            reason: format!("{channel:?} is not a plain identifier"),
        });
    }
    let t = rel.quoted();
    let function = rel.quoted_sibling(&format!("{}_notify", rel.name));
    let trigger = quote(&format!("{}_notify", rel.name));
    let order_idx = quote(&format!("{}_reading_order_idx", rel.name));
    let notify_function = super::notify_function_sql(&function);
    Ok(format!(
        r#"-- An append-only log. Consumers read it by writing transaction, then
-- position, once no transaction still running can add an event before.
CREATE TABLE IF NOT EXISTS {t} (
    "global_position" bigserial PRIMARY KEY,
    "transaction_id" xid8 NOT NULL DEFAULT pg_current_xact_id(),
    "aggregate_type" text NOT NULL,
    "aggregate_id" text NOT NULL,
    "event_type" text NOT NULL,
    "payload" jsonb NOT NULL DEFAULT '{{}}',
    "created_at" timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {order_idx} ON {t} ("transaction_id", "global_position");
{notify_function}CREATE OR REPLACE TRIGGER {trigger} AFTER INSERT ON {t}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}('{channel}');
"#
    ))
}
