//! `dbworker migration`: the DDL for a new job table, its optional columns,
//! the shared control tables and the SQL helpers, printed for a migration.

use anyhow::Result;
use clap::Args;
use dbworker::{
    cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE},
    consumers::{DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE},
    control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE},
    cron::DEFAULT_CRON_TABLE,
    ddl::{
        FairClaims, OptionalColumns, add_jobs_function_sql, admin_functions_sql,
        consumer_tables_sql, cron_table_sql, enqueue_function_sql, fair_claims_sql,
        history_table_sql, hot_layout_sql, job_table_sql, leader_table_sql, limit_table_sql,
        node_table_sql, notify_trigger_sql, optional_columns_sql, partitioned_job_table_sql,
        partitioned_keys_sql, pause_table_sql, progress_table_sql, signals_sql, workflows_sql,
    },
    history::DEFAULT_HISTORY_TABLE,
};

use crate::args::parse_rename;

#[derive(Debug, Args)]
pub(crate) struct MigrationArgs {
    /// The new job table's name, optionally schema-qualified.
    #[arg(long)]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
    /// Partition the job table by range of `queued_at` (primary key `(id,
    /// queued_at)`, a default partition, `<table>_create_partitions(ahead)`;
    /// with --keys, a key table kept by triggers). Not with --workflows.
    #[arg(long)]
    partitioned: bool,
    /// How much of `queued_at` one partition holds: hour, day, week or month.
    #[arg(long, requires = "partitioned", default_value = "day")]
    partition_interval: String,
    /// Also give the table the HOT layout: a generated column
    /// `dbworker_live`, one index over it in place of the two on the state,
    /// and pages kept 70 % free, so claims are HOT updates (faster; a
    /// table about three times larger on disk). Stores find it at start-up.
    /// Adding the column rewrites an existing table. Not with --keys, --fair,
    /// --partitioned or --workflows (their indexes read the state, which
    /// would make every claim a non-HOT update again).
    #[arg(long, conflicts_with_all = ["keys", "fair", "partitioned", "workflows"])]
    hot_layout: bool,
    /// Also print the trigger that NOTIFYs listening workers when jobs are queued.
    #[arg(long)]
    notify: bool,
    /// The NOTIFY channel (default: `dbworker_<table>`, what `Listen::TableChannel` listens on).
    #[arg(long, requires = "notify")]
    channel: Option<String>,
    /// Also add a `job_key` column and its unique index (job keys).
    #[arg(long)]
    keys: bool,
    /// Also add a `queue` column.
    #[arg(long)]
    queue: bool,
    /// Also add a `priority` column and its dequeue index.
    #[arg(long)]
    priority: bool,
    /// Also add a `max_retries` column (per-job retry limits).
    #[arg(long)]
    max_retries: bool,
    /// Also add a `kind` column (many kinds of job in one table).
    #[arg(long)]
    kind: bool,
    /// Also add a `payload` column (jsonb: typed jobs' arguments, for
    /// `JobTableOptions::payload_column`).
    #[arg(long)]
    payload: bool,
    /// Also add what typed jobs need: `kind` and `payload` (as --kind --payload).
    #[arg(long)]
    typed: bool,
    /// Also add a `flags` column (text[]: claims skip jobs with a forbidden flag).
    #[arg(long)]
    flags: bool,
    /// Also add an `errors` column (jsonb: the per-attempt error history,
    /// for `JobTableOptions::error_history_column`).
    #[arg(long)]
    error_history: bool,
    /// Also add a `result` column (jsonb: what handlers return with their
    /// completion, for `JobTableOptions::result_column`).
    #[arg(long)]
    results: bool,
    /// Also add fair claims: `fair_key`, `fair_tag`, `fair_cost`, the weight
    /// table `<table>_fair_weights` and the triggers that tag jobs, so every
    /// key gets its share of the claims (per queue and priority with --queue
    /// and --priority).
    #[arg(long)]
    fair: bool,
    /// With --fair: where a job inserted without a `fair_key` takes it from,
    /// an SQL expression over NEW (e.g. "NEW.payload->>'customer'").
    #[arg(long, requires = "fair")]
    fair_key_from: Option<String>,
    /// With --fair: one key's enqueue transactions take turns, so shares hold
    /// to 2 jobs however many producers a key has (they wait for each other).
    #[arg(long, requires = "fair")]
    fair_serialize_keys: bool,
    /// Also add waits and signals: the `awaiting` column, the mailbox
    /// `<table>_signals` and `<table>_signal(job_id, name, payload, dedupe)`.
    #[arg(long)]
    signals: bool,
    /// Also add `progress`, `checkpoint` and `progress_seq` (a handler's
    /// public progress and the checkpoint its next attempt resumes from).
    #[arg(long)]
    progress: bool,
    /// Instead of --progress's columns, create the side table
    /// `<table>_progress` (job_id, progress, checkpoint, progress_seq), for
    /// a job table you cannot alter: its statements touch nothing of the
    /// job table, so a role that cannot alter it runs them alone.
    #[arg(long, conflicts_with = "progress")]
    progress_table: bool,
    /// Also add `traceparent`, `tracestate` (the enqueue's W3C trace
    /// context; SQL producers set it with `SET LOCAL dbworker.traceparent`)
    /// and `trace_follows` (the span the next attempt links to).
    #[arg(long)]
    traces: bool,
    /// Also create the pause table (`dbworker_pauses`), shared by every job table.
    #[arg(long)]
    pauses: bool,
    /// Also add the index the purger uses (`finished_at` over final states).
    #[arg(long)]
    retention: bool,
    /// Also create the limit table (`dbworker_limits`), shared by every job table.
    #[arg(long)]
    limits: bool,
    /// Also create the cron table (`dbworker_cron`), shared by every job table.
    #[arg(long)]
    cron: bool,
    /// Also create the history table (`dbworker_history`), shared by every
    /// job table, and the index over `finished_at` it reads through (as
    /// --retention): the dashboard's charts and `dbworker top` read it.
    #[arg(long)]
    history: bool,
    /// Also create the worker registry (`dbworker_nodes`) and the leader lease
    /// table (`dbworker_leaders`), shared by every job table.
    #[arg(long)]
    nodes: bool,
    /// Also create the log consumers' assignment, checkpoint and group members
    /// tables (with --nodes for the registry and leases they need).
    #[arg(long)]
    consumers: bool,
    /// Also add workflows: the `pending` state's columns, the dependency
    /// table `<table>_deps` and the trigger that releases dependents.
    #[arg(long)]
    workflows: bool,
    /// Also print `<table>_enqueue(fields jsonb, run_at, ...)`, a SQL function
    /// for producers in other languages (with the optional columns chosen above).
    #[arg(long)]
    enqueue_function: bool,
    /// Also print `<table>_add_jobs(specs jsonb[], key_mode)`, many jobs in one
    /// call (with the enqueue function, which it calls once per spec).
    #[arg(long)]
    add_jobs: bool,
    /// Also print the admin functions `<table>_complete_jobs`,
    /// `_permanently_fail_jobs`, `_reschedule_jobs` and (with --keys)
    /// `_remove_job`, for operators and other languages.
    #[arg(long)]
    admin_functions: bool,
}

/// Prints the DDL; the generators' errors (a bad name, colliding renames)
/// say what is wrong.
pub(crate) fn migration(args: MigrationArgs) -> Result<()> {
    print!("{}", migration_sql(args)?);
    Ok(())
}

/// The DDL the arguments ask for.
fn migration_sql(args: MigrationArgs) -> Result<String> {
    if args.partitioned {
        refuse_on_partitioned(&args)?;
    }
    let renames = args.renames.into_iter().collect();
    let mut ddl = if args.partitioned {
        partitioned_job_table_sql(&args.table, &renames, args.partition_interval.parse()?)?
    } else {
        job_table_sql(&args.table, &renames)?
    };
    let mut optional = OptionalColumns::default();
    optional.keys = args.keys;
    optional.queue = args.queue;
    optional.priority = args.priority;
    optional.max_retries = args.max_retries;
    optional.kind = args.kind || args.typed;
    optional.payload = args.payload || args.typed;
    optional.flags = args.flags;
    optional.error_history = args.error_history;
    optional.results = args.results;
    optional.progress = args.progress;
    optional.traces = args.traces;
    optional.retention = args.retention || args.history;
    // A partitioned table keeps its keys in a key table, not a unique index.
    let mut columns = optional;
    columns.keys = optional.keys && !args.partitioned;
    if columns != OptionalColumns::default() {
        ddl.push('\n');
        ddl.push_str(&optional_columns_sql(&args.table, &renames, columns)?);
    }
    if args.hot_layout {
        // After every index on the state it replaces.
        ddl.push('\n');
        ddl.push_str(&hot_layout_sql(&args.table, &renames, optional)?);
    }
    if optional.keys && args.partitioned {
        ddl.push('\n');
        ddl.push_str(&partitioned_keys_sql(&args.table, &renames)?);
    }
    if args.workflows {
        ddl.push('\n');
        ddl.push_str(&workflows_sql(&args.table, &renames)?);
    }
    if args.fair {
        let mut fair = FairClaims::default();
        fair.queue_column = optional.queue.then(|| "queue".to_owned());
        fair.priority_column = optional.priority.then(|| "priority".to_owned());
        fair.key_from = args.fair_key_from.clone();
        fair.serialize_keys = args.fair_serialize_keys;
        ddl.push('\n');
        ddl.push_str(&fair_claims_sql(&args.table, &renames, &fair)?);
    }
    if args.signals {
        ddl.push('\n');
        ddl.push_str(&signals_sql(&args.table, &renames)?);
    }
    if args.progress_table {
        ddl.push('\n');
        ddl.push_str(&progress_table_sql(&args.table)?);
    }
    if args.cron {
        ddl.push('\n');
        ddl.push_str(&cron_table_sql(DEFAULT_CRON_TABLE)?);
    }
    if args.history {
        ddl.push('\n');
        ddl.push_str(&history_table_sql(DEFAULT_HISTORY_TABLE)?);
    }
    if args.nodes {
        ddl.push('\n');
        ddl.push_str(&node_table_sql(DEFAULT_NODE_TABLE)?);
        ddl.push_str(&leader_table_sql(DEFAULT_LEADER_TABLE)?);
    }
    if args.consumers {
        ddl.push('\n');
        ddl.push_str(&consumer_tables_sql(
            DEFAULT_ASSIGNMENT_TABLE,
            DEFAULT_CHECKPOINT_TABLE,
        )?);
    }
    if args.limits {
        ddl.push('\n');
        ddl.push_str(&limit_table_sql(DEFAULT_LIMIT_TABLE)?);
    }
    if args.pauses {
        ddl.push('\n');
        ddl.push_str(&pause_table_sql(DEFAULT_PAUSE_TABLE)?);
    }
    if args.enqueue_function || args.add_jobs {
        ddl.push('\n');
        ddl.push_str(&enqueue_function_sql(&args.table, &renames, optional)?);
    }
    if args.add_jobs {
        ddl.push('\n');
        ddl.push_str(&add_jobs_function_sql(&args.table, &renames, optional)?);
    }
    if args.admin_functions {
        ddl.push('\n');
        ddl.push_str(&admin_functions_sql(&args.table, &renames, optional)?);
    }
    if args.notify {
        ddl.push('\n');
        ddl.push_str(&notify_trigger_sql(
            &args.table,
            &renames,
            args.channel.as_deref(),
        )?);
    }
    Ok(ddl)
}

/// The features that cannot work on a partitioned job table, refused by name.
fn refuse_on_partitioned(args: &MigrationArgs) -> Result<()> {
    if args.workflows {
        return Err(crate::exit::usage(
            "--workflows cannot be used with --partitioned: the dependency table's foreign key must reference a unique id, and a partitioned table's primary key is (id, queued_at)",
        ));
    }
    if args.keys && (args.enqueue_function || args.add_jobs) {
        return Err(crate::exit::usage(
            "--enqueue-function and --add-jobs with --keys cannot be used with --partitioned: they rely on the unique key index (ON CONFLICT), which a partitioned table keeps in a key table instead; enqueue keyed jobs through dbworker's Enqueuer",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: MigrationArgs,
    }

    fn sql(args: &[&str]) -> String {
        let command = Command::try_parse_from([&["migration"], args].concat()).unwrap();
        migration_sql(command.args).unwrap()
    }

    #[test]
    fn typed_prints_the_kind_and_payload_columns() {
        let kind = r#"ALTER TABLE "jobs" ADD COLUMN IF NOT EXISTS "kind" text"#;
        let payload =
            r#"ALTER TABLE "jobs" ADD COLUMN IF NOT EXISTS "payload" jsonb NOT NULL DEFAULT '{}';"#;
        let typed = sql(&["--table", "jobs", "--typed"]);
        assert!(typed.contains(kind) && typed.contains(payload), "{typed}");
        let only_payload = sql(&["--table", "jobs", "--payload"]);
        assert!(only_payload.contains(payload) && !only_payload.contains(kind));
        assert!(!sql(&["--table", "jobs"]).contains(payload));
    }

    #[test]
    fn history_prints_its_table_and_the_retention_index() {
        let ddl = sql(&["--table", "jobs", "--history"]);
        assert!(
            ddl.contains(r#"CREATE TABLE IF NOT EXISTS "dbworker_history""#),
            "{ddl}"
        );
        assert!(
            ddl.contains(r#"CREATE INDEX IF NOT EXISTS "jobs_finished_idx""#),
            "{ddl}"
        );
    }
    #[test]
    fn hot_layout_comes_after_the_indexes_it_replaces() {
        let ddl = sql(&[
            "--table",
            "jobs",
            "--hot-layout",
            "--priority",
            "--retention",
        ]);
        let created = ddl.find(r#"CREATE INDEX IF NOT EXISTS "jobs_priority_dequeue_idx""#);
        let dropped = ddl.find(r#"DROP INDEX IF EXISTS "jobs_priority_dequeue_idx""#);
        assert!(created.unwrap() < dropped.unwrap(), "{ddl}");
        assert!(ddl.contains(r#"CREATE INDEX IF NOT EXISTS "jobs_live_idx""#));
        for other in ["--keys", "--fair", "--partitioned", "--workflows"] {
            let refused =
                Command::try_parse_from(["migration", "--table", "jobs", "--hot-layout", other]);
            assert!(refused.is_err(), "--hot-layout {other} accepted");
        }
    }

    #[test]
    fn progress_table_creates_the_side_table_instead_of_the_columns() {
        let ddl = sql(&["--table", "app.jobs", "--progress-table"]);
        assert!(
            ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."jobs_progress""#)
                && !ddl.contains(r#"ADD COLUMN IF NOT EXISTS "progress""#),
            "{ddl}"
        );
        let both = Command::try_parse_from([
            "migration",
            "--table",
            "jobs",
            "--progress",
            "--progress-table",
        ]);
        assert!(both.is_err(), "one storage or the other");
    }
}
