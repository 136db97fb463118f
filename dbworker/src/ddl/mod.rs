//! Every DDL generator (what `dbworker migration` prints): the job table with its
//! standard columns (renamed as configured) and the indexes the claim and the
//! resetter use, optional columns, the SQL enqueue function, the NOTIFY
//! trigger, and the shared control tables.

use std::collections::HashMap;

use crate::columns::{Columns, Relation, quote};
use crate::error::Result;

mod enqueue_function;
mod fairness;
mod functions;
mod layout;
mod notify;
mod partitions;
mod progress;
mod release_set;
mod signals;
mod tables;
mod workflows;

pub use enqueue_function::enqueue_function_sql;
use enqueue_function::optional_params;
pub use fairness::{FairClaims, fair_claims_sql};
pub use functions::{MAX_FUNCTION_IDS, add_jobs_function_sql, admin_functions_sql};
pub use layout::{HOT_FILLFACTOR, hot_layout_sql};

pub use crate::columns::STANDARD_COLUMNS;
pub(crate) use notify::notify_function_sql;
pub use notify::notify_trigger_sql;
pub use partitions::{PartitionInterval, partitioned_job_table_sql, partitioned_keys_sql};
pub use progress::progress_table_sql;
pub use signals::signals_sql;
pub use tables::{
    consumer_tables_sql, cron_table_sql, events_table_sql, history_table_sql, leader_table_sql,
    limit_table_sql, node_table_sql, pause_table_sql,
};
pub use workflows::workflows_sql;

/// Returns `CREATE TABLE` and `CREATE INDEX` statements for a job table named
/// `table_name` (optionally schema-qualified) with the standard columns,
/// renamed by `alternate_column_names`. Add your own columns after generating.
///
/// ```
/// let ddl = dbworker::ddl::job_table_sql("email_jobs", &Default::default()).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "email_jobs""#));
/// ```
pub fn job_table_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    // Postgres truncates names to 63 bytes: long table names would give both
    // indexes one name, and `IF NOT EXISTS` would skip the second.
    let index = |suffix: &str| rel.quoted_derived(suffix);
    Ok(format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
{columns}
);

-- The claim scans eligible rows in id order; a partial index keeps it small.
CREATE INDEX IF NOT EXISTS {dequeue_idx} ON {table} ({id}) WHERE {state} IN ('queued', 'errored');
-- The resetter looks only at processing rows. Keyed on id, not the heartbeat
-- column, so heartbeats stay HOT updates.
CREATE INDEX IF NOT EXISTS {processing_idx} ON {table} ({id}) WHERE {state} = 'processing';
-- Claims leave dead index entries behind; vacuum this table often.
ALTER TABLE {table} SET ({AUTOVACUUM});
"#,
        columns = standard_columns(&c, "bigserial PRIMARY KEY"),
        id = quote(&c.id),
        state = quote(&c.state),
        dequeue_idx = index("dequeue_idx"),
        processing_idx = index("processing_idx"),
    ))
}

/// The per-table autovacuum settings of a job table (or of each partition).
pub(crate) const AUTOVACUUM: &str =
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0";

/// The standard columns of a `CREATE TABLE`, the id typed as `id_type`.
pub(super) fn standard_columns(c: &Columns, id_type: &str) -> String {
    let q = |s: &str| quote(s);
    format!(
        r#"    {id} {id_type},
    {state} text NOT NULL DEFAULT 'queued',
    {failure_message} text,
    {queued_at} timestamptz NOT NULL DEFAULT now(),
    {started_at} timestamptz,
    {finished_at} timestamptz,
    {process_after} timestamptz,
    {num_resets} integer NOT NULL DEFAULT 0,
    {num_failures} integer NOT NULL DEFAULT 0,
    {last_heartbeat_at} timestamptz,
    {execution_logs} json[],
    {worker_hostname} text NOT NULL DEFAULT '',
    {cancel} boolean NOT NULL DEFAULT false"#,
        id = q(&c.id),
        state = q(&c.state),
        failure_message = q(&c.failure_message),
        queued_at = q(&c.queued_at),
        started_at = q(&c.started_at),
        finished_at = q(&c.finished_at),
        process_after = q(&c.process_after),
        num_resets = q(&c.num_resets),
        num_failures = q(&c.num_failures),
        last_heartbeat_at = q(&c.last_heartbeat_at),
        execution_logs = q(&c.execution_logs),
        worker_hostname = q(&c.worker_hostname),
        cancel = q(&c.cancel),
    )
}

/// Optional columns for the enqueue side, each added by
/// [`optional_columns_sql`] with what it needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OptionalColumns {
    /// `job_key text` and the unique index over live states that
    /// [`NewJob::key`](crate::NewJob::key) relies on.
    pub keys: bool,
    /// `queue text NOT NULL DEFAULT 'default'`.
    pub queue: bool,
    /// `priority integer NOT NULL DEFAULT 0` and a dequeue index for
    /// `ClaimOptions::order_by = "j.priority DESC, j.id"`.
    pub priority: bool,
    /// `max_retries integer` (NULL: the store's `max_num_retries`), for
    /// `JobTableOptions::max_retries_column`.
    pub max_retries: bool,
    /// `kind text NOT NULL DEFAULT 'default'`, what a
    /// [`KindRegistry`](workerutil::KindRegistry) dispatches on.
    pub kind: bool,
    /// `payload jsonb NOT NULL DEFAULT '{}'`, where typed jobs keep their
    /// arguments ([`NewJob::args`](crate::NewJob::args); with `kind`, what
    /// [`OptionalColumns::typed`] adds).
    pub payload: bool,
    /// No column: an index on `finished_at` over the final states, so the
    /// [`Purger`](crate::maintenance::Purger) finds old rows without scanning the table.
    pub retention: bool,
    /// `flags text[]` (NULL: no flag), set by [`NewJob::flags`](crate::NewJob::flags);
    /// claims skip jobs carrying a flag in `ClaimOptions::forbidden_flags`.
    pub flags: bool,
    /// `errors jsonb` (NULL: no failure yet), the per-attempt error history
    /// for `JobTableOptions::error_history_column`.
    pub error_history: bool,
    /// `result jsonb`, the result a handler stores with its completion
    /// ([`DbJob::set_result`](crate::DbJob::set_result)), for
    /// `JobTableOptions::result_column`; and `upstream_ids bigint[]`, the jobs a
    /// dependent waited for (required by `JobTable::new` with workflows and a
    /// result column), so it can read their
    /// results ([`DbJob::upstream_results`](crate::DbJob::upstream_results)).
    pub results: bool,
    /// `progress jsonb` (public), `checkpoint jsonb` (private) and
    /// `progress_seq bigint`, for `JobTableOptions::progress`:
    /// [`DbJob::set_progress`](crate::DbJob::set_progress) and
    /// [`DbJob::save_checkpoint`](crate::DbJob::save_checkpoint).
    pub progress: bool,
    /// `traceparent text` and `tracestate text`, the W3C trace context of the
    /// job's enqueue (defaulting to the session settings
    /// `dbworker.traceparent` and `dbworker.tracestate`, so SQL producers and
    /// triggers pass it with `SET LOCAL`), and `trace_follows text`, the span
    /// the next attempt links to: for `JobTableOptions::traces`.
    pub traces: bool,
}

impl OptionalColumns {
    /// Every optional column.
    pub fn all() -> Self {
        OptionalColumns {
            keys: true,
            queue: true,
            priority: true,
            max_retries: true,
            kind: true,
            payload: true,
            retention: true,
            flags: true,
            error_history: true,
            results: true,
            progress: true,
            traces: true,
        }
    }

    /// The columns typed jobs need ([`JobArgs`](crate::JobArgs)): `kind` and `payload`.
    ///
    /// ```
    /// let ddl = dbworker::ddl::optional_columns_sql(
    ///     "jobs",
    ///     &Default::default(),
    ///     dbworker::ddl::OptionalColumns::typed(),
    /// )
    /// .unwrap();
    /// assert!(ddl.contains(r#"ADD COLUMN IF NOT EXISTS "kind" text"#));
    /// assert!(ddl.contains(r#"ADD COLUMN IF NOT EXISTS "payload" jsonb NOT NULL DEFAULT '{}'"#));
    /// ```
    pub fn typed() -> Self {
        OptionalColumns {
            kind: true,
            payload: true,
            ..OptionalColumns::default()
        }
    }
}

/// `ALTER TABLE` and `CREATE INDEX` statements adding the chosen optional
/// columns (named `job_key`, `queue`, `priority`) to a job table; safe to run
/// again.
///
/// ```
/// let mut columns = dbworker::ddl::OptionalColumns::default();
/// columns.keys = true;
/// let ddl = dbworker::ddl::optional_columns_sql("email_jobs", &Default::default(), columns).unwrap();
/// assert!(ddl.contains("CREATE UNIQUE INDEX"));
/// ```
pub fn optional_columns_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    columns: OptionalColumns,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let (id, state) = (quote(&c.id), quote(&c.state));
    let mut ddl = String::new();
    if columns.keys {
        ddl.push_str(&format!(
            r#"-- Job keys: at most one live (queued, errored or processing) job per key.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "job_key" text;
CREATE UNIQUE INDEX IF NOT EXISTS {key_idx} ON {table} ("job_key") WHERE {state} IN ('queued', 'errored', 'processing');
-- The unsafe_dedupe key mode also looks for failed jobs with the key.
CREATE INDEX IF NOT EXISTS {failed_key_idx} ON {table} ("job_key") WHERE {state} = 'failed';
"#,
            key_idx = index("job_key_idx"),
            failed_key_idx = index("job_key_failed_idx"),
        ));
    }
    if columns.queue {
        ddl.push_str(&format!(
            r#"-- Named queues.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "queue" text NOT NULL DEFAULT 'default';
"#
        ));
    }
    if columns.priority {
        ddl.push_str(&format!(
            r#"-- Priorities: use order_by = "j.priority DESC, j.id" (this index serves it).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "priority" integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {priority_idx} ON {table} ("priority" DESC, {id}) WHERE {state} IN ('queued', 'errored');
"#,
            priority_idx = index("priority_dequeue_idx"),
        ));
    }
    if columns.retention {
        ddl.push_str(&format!(
            r#"-- Retention: the purger deletes old finished rows by finished_at.
CREATE INDEX IF NOT EXISTS {finished_idx} ON {table} ({finished_at}) WHERE {state} IN ('completed', 'failed', 'canceled');
"#,
            finished_idx = index("finished_idx"),
            finished_at = quote(&c.finished_at),
        ));
    }
    if columns.kind {
        ddl.push_str(&format!(
            r#"-- Job kinds: one table, a handler per kind (workerutil::KindRegistry).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "kind" text NOT NULL DEFAULT 'default';
"#
        ));
    }
    if columns.payload {
        ddl.push_str(&format!(
            r#"-- Typed jobs' arguments as JSON: JobTableOptions::payload_column = Some("payload").
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "payload" jsonb NOT NULL DEFAULT '{{}}';
"#
        ));
    }
    if columns.max_retries {
        ddl.push_str(&format!(
            r#"-- Per-job retry limits: JobTableOptions::max_retries_column = Some("max_retries").
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "max_retries" integer;
"#
        ));
    }
    if columns.flags {
        // No index: the claim tests flags on rows its own index already found.
        ddl.push_str(&format!(
            r#"-- Flags: claims skip jobs carrying a forbidden flag (JobTableOptions::flags_column, StoreOptions::claim.forbidden_flags).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "flags" text[];
"#
        ));
    }
    if columns.error_history {
        ddl.push_str(&format!(
            r#"-- Error history: JobTableOptions::error_history_column = Some("errors"); failing marks append {{attempt, at, message, worker}}.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "errors" jsonb;
"#
        ));
    }
    if columns.progress {
        ddl.push_str(&format!(
            r#"-- Progress and checkpoints: JobTableOptions::progress = true; DbJob::set_progress, DbJob::save_checkpoint.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "progress" jsonb;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "checkpoint" jsonb;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "progress_seq" bigint NOT NULL DEFAULT 0;
"#
        ));
    }
    if columns.traces {
        ddl.push_str(&format!(
            r#"-- Traces: JobTableOptions::traces = true; each attempt's span links to its enqueue (SET LOCAL dbworker.traceparent in SQL producers).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "traceparent" text DEFAULT nullif(current_setting('dbworker.traceparent', true), '');
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "tracestate" text DEFAULT nullif(current_setting('dbworker.tracestate', true), '');
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "trace_follows" text;
"#
        ));
    }
    if columns.results {
        ddl.push_str(&format!(
            r#"-- Results: JobTableOptions::result_column = Some("result"); DbJob::set_result stores one with the completion.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "result" jsonb;
-- The jobs a dependent waited for (required by JobTable::new with workflows and results), for DbJob::upstream_results.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "upstream_ids" bigint[];
"#
        ));
    }
    Ok(ddl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_reach_the_ddl() {
        let mut renames = HashMap::new();
        renames.insert("state".to_owned(), "status".to_owned());
        let ddl = job_table_sql("app.jobs", &renames).unwrap();
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."jobs""#));
        assert!(ddl.contains(r#""status" text NOT NULL DEFAULT 'queued'"#));
        assert!(ddl.contains(r#"WHERE "status" IN ('queued', 'errored')"#));
        assert!(!ddl.contains(r#""state""#));
    }

    #[test]
    fn optional_columns_follow_renames_and_are_each_optional() {
        let mut renames = HashMap::new();
        renames.insert("state".to_owned(), "status".to_owned());
        let all = optional_columns_sql("app.jobs", &renames, OptionalColumns::all()).unwrap();
        assert!(
            all.contains(r#"ALTER TABLE "app"."jobs" ADD COLUMN IF NOT EXISTS "job_key" text"#)
        );
        assert!(all.contains(r#"WHERE "status" IN ('queued', 'errored', 'processing')"#));
        assert!(all.contains(r#"("priority" DESC, "id") WHERE "status" IN ('queued', 'errored')"#));
        assert!(all.contains(r#""queue" text NOT NULL DEFAULT 'default'"#));
        let none = optional_columns_sql("jobs", &renames, OptionalColumns::default()).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(job_table_sql("jobs; drop table x", &HashMap::new()).is_err());
        assert!(job_table_sql("order", &HashMap::new()).is_err());
    }

    #[test]
    fn quoted_names_are_quoted_everywhere() {
        let renames = HashMap::from([("process_after".to_owned(), "\"it's%\"".to_owned())]);
        let ddl = job_table_sql("app.\"order\"", &renames).unwrap();
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."order" ("#));
        assert!(ddl.contains(r#""it's%" timestamptz"#));
        assert!(ddl.contains(r#"CREATE INDEX IF NOT EXISTS "order_dequeue_idx" ON "app"."order""#));
        let all = optional_columns_sql("\"order\"", &renames, OptionalColumns::all()).unwrap();
        assert!(all.contains(r#"ALTER TABLE "order" ADD COLUMN"#));
        // In the enqueue function, names sit inside literals and format() strings.
        let f = enqueue_function_sql("\"My Table\"", &renames, OptionalColumns::all()).unwrap();
        assert!(f.contains(r#"CREATE OR REPLACE FUNCTION "My Table_enqueue"("#));
        assert!(f.contains(r#"jsonb_build_object('it''s%', run_at"#), "{f}");
        assert!(f.contains(r#"k <> 'it''s%'"#), "{f}");
        let renames = HashMap::from([("state".to_owned(), "\"50% 'done'\"".to_owned())]);
        let f = enqueue_function_sql("jobs", &renames, OptionalColumns::all()).unwrap();
        assert!(f.contains(r#"WHERE "50%% ''done''" IN (''queued''"#), "{f}");
        let trigger = notify_trigger_sql("\"it's\"", &HashMap::new(), None).unwrap();
        assert!(trigger.contains(r#"ON "it's""#), "{trigger}");
        assert!(
            trigger
                .contains(r#"EXECUTE FUNCTION "it's_dbworker_notify_insert"('dbworker_it''s');"#),
            "{trigger}"
        );
    }
}
