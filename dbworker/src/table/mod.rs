//! [`JobTable`]: one job table, described once, checked once, and shared by
//! every service that reads or writes it.
//!
//! A job table is the application's own table (or a view over it): its name,
//! the standard columns it renamed, the optional columns it has and the
//! control tables that steer its claims. [`JobTable::new`] validates that
//! description and checks it against the database (relations, columns,
//! types, privileges, the unique index keys rely on) before any service
//! starts; the store, the enqueuer, the admin, the resetter, the purger, the
//! scheduler, workflows, pauses, limits, the dashboard and the command line
//! then take the same value, so they can never disagree about the table.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::columns::{Columns, Relation, column_name};
use crate::error::{Error, Result};
use crate::sql::{ErrorHistory, Table};

mod aging;
mod check;
mod layout;
mod partitioned;
mod progress;

pub use aging::Aging;

/// The default `error_history_limit`: enough attempts to see a pattern
/// (the default `max_num_retries` gives 11), small enough to keep rows narrow.
pub const DEFAULT_ERROR_HISTORY_LIMIT: u32 = 20;

/// The default `connect_timeout` of the start-up checks.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a job table looks like: the input of [`JobTable::new`].
///
/// Names are written as in SQL: `"jobs"`, `"app.jobs j"` (with an alias),
/// `"\"order\" o"` for a name SQL must quote; columns likewise.
///
/// ```
/// use dbworker::JobTableOptions;
/// let mut options = JobTableOptions::new("app.email_jobs j");
/// options.queue_column = Some("queue".into());
/// options.alternate_column_names.insert("state".into(), "status".into());
/// assert!(options.validate().is_ok());
/// ```
///
/// Deserializable from a config file: `table_name` is required, every other
/// field left out keeps its default, `connect_timeout` is written as in
/// [`workerutil::duration`] (`"10s"`), and an unknown field is refused.
///
/// ```
/// let options: dbworker::JobTableOptions = serde_json::from_str(r#"{
///     "table_name": "app.email_jobs j",
///     "queue_column": "queue",
///     "alternate_column_names": { "state": "status" }
/// }"#).unwrap();
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct JobTableOptions {
    /// The job table, optionally schema-qualified and with an alias:
    /// `"example_jobs"`, `"app.example_jobs j"`. Required.
    pub table_name: String,
    /// A view (with alias) a store reads its records through, e.g. one
    /// joining the job table to related tables. It must expose the table's
    /// `id`, `state` and `process_after` (renamed as configured). Claims and
    /// state changes still run on the table. `None`: records come from the table.
    #[serde(default)]
    pub view_name: Option<String>,
    /// Renames standard columns: `{"state": "status"}` makes every statement
    /// use `status` where it would use `state`.
    #[serde(default)]
    pub alternate_column_names: HashMap<String, String>,
    /// Turn on every optional column the table has under its standard name
    /// (`queue`, `kind`, `job_key`, `priority`, `max_retries`, `flags`,
    /// `payload`, `result`, `errors`) with a usable type, and workflows when
    /// it has `workflow_id`, as `dbworker migration` adds them. A column named
    /// below is used as named. Default `false`: only the columns named below.
    #[serde(default)]
    pub detect: bool,
    /// The queue column: per-queue workers, pauses, limits, filters.
    #[serde(default)]
    pub queue_column: Option<String>,
    /// The kind column: typed jobs, per-kind handlers, filters.
    #[serde(default)]
    pub kind_column: Option<String>,
    /// The job key column (`dbworker migration --keys` adds `job_key` and the
    /// unique index enqueues rely on, which the check looks for).
    #[serde(default)]
    pub key_column: Option<String>,
    /// The integer column a store's `order_by` may rank by (`--priority`).
    #[serde(default)]
    pub priority_column: Option<String>,
    /// A nullable integer column holding a per-job retry limit
    /// (`--max-retries`); NULL means the store's `max_num_retries`.
    #[serde(default)]
    pub max_retries_column: Option<String>,
    /// The `text[]` column holding each job's flags (`--flags`), over the
    /// view's alias when records are read through a view.
    #[serde(default)]
    pub flags_column: Option<String>,
    /// The `jsonb` payload column: typed jobs' arguments, item jobs' items,
    /// cron jobs' payloads (`--payload`).
    #[serde(default)]
    pub payload_column: Option<String>,
    /// The `jsonb` column a completion writes the handler's result to (`--results`).
    #[serde(default)]
    pub result_column: Option<String>,
    /// The `jsonb` column every failing mark appends its error to
    /// (`--error-history` adds `errors`), `at` from the database clock.
    #[serde(default)]
    pub error_history_column: Option<String>,
    /// With `error_history_column`: the most entries a job keeps, the oldest
    /// dropped first. At least 1. Default [`DEFAULT_ERROR_HISTORY_LIMIT`].
    #[serde(default = "default_error_history_limit")]
    pub error_history_limit: u32,
    /// The table has workflows (`dbworker migration --workflows`): jobs may
    /// wait for other jobs.
    #[serde(default)]
    pub workflows: bool,
    /// The pause table (`--pauses` creates `dbworker_pauses`): claims skip
    /// the table or a queue while it is paused. Needs `queue_column` for
    /// per-queue pauses.
    #[serde(default)]
    pub pause_table: Option<String>,
    /// The limit table (`--limits` creates `dbworker_limits`): per-queue
    /// concurrency, per-key and rate limits, enforced by the claim. Needs
    /// `queue_column`; not with a view nor aging. Unset: `dbworker_limits`
    /// when it exists, unless the table has a view or aging.
    #[serde(default)]
    pub limit_table: Option<String>,
    /// With `limit_table`: the column whose value keys per-key limits.
    #[serde(default)]
    pub limit_key_column: Option<String>,
    /// What a store reads of each claimed row: SQL expressions over the
    /// view's (or table's) alias, in the order its record type reads them,
    /// e.g. `["j.id", "j.payload", "r.name"]`. Empty (the default): `alias.*`,
    /// which suits a record read with `sqlx::FromRow`; a
    /// [`Client`](crate::Client) then reads its typed jobs' `id`, `kind` and
    /// `payload` from the table's columns, renamed or not.
    #[serde(default)]
    pub column_expressions: Vec<String>,
    /// The order claims take jobs in: an SQL `ORDER BY` over the view's (or
    /// table's) alias, e.g. `"j.priority DESC, j.id"`. `None` (the default):
    /// by id, which also lets stores keep a claim cursor
    /// ([`ClaimOptions::claim_cursor`](crate::ClaimOptions::claim_cursor)).
    #[serde(default)]
    pub order_by: Option<String>,
    /// The table has fair claims (`dbworker migration --fair`): the check
    /// requires its columns, weight table and tagging triggers. A table whose
    /// tagging triggers exist is fair for every worker, whatever this says,
    /// as a pause is honoured by all: claims then take jobs by priority, then
    /// tag (`order_by` must order by `fair_tag` when set). Default `false`.
    #[serde(default)]
    pub fair: bool,
    /// Jobs keep progress and checkpoints: handlers report progress and
    /// save checkpoints the next attempt resumes from
    /// ([`DbJob::save_checkpoint`](crate::DbJob::save_checkpoint)), in the
    /// table's `progress`, `checkpoint` and `progress_seq` (`dbworker
    /// migration --progress`) or, on a table without them, in the side table
    /// `<table>_progress` (`--progress-table`, for a table its owner cannot
    /// alter). Turned on by `detect` when either exists. Default `false`.
    #[serde(default)]
    pub progress: bool,
    /// The table has `traceparent`, `tracestate` and `trace_follows`
    /// (`dbworker migration --traces`): every enqueue stores its trace
    /// context, and each attempt's span is linked to it (the `opentelemetry`
    /// feature). Turned on by `detect` when the three exist. Default `false`.
    #[serde(default)]
    pub traces: bool,
    /// Jobs may wait for signals (`dbworker migration --signals`): the table
    /// has `awaiting` and the mailbox `<table>_signals`
    /// ([`HandlerError::wait_for`](workerutil::HandlerError::wait_for),
    /// [`Signals`](crate::Signals)). Turned on by `detect` when both exist.
    /// Default `false`.
    #[serde(default)]
    pub signals: bool,
    /// Priority aging: a waiting job rises a priority level for every
    /// `interval` it waits, so a flood of urgent work cannot starve the rest.
    /// Computed by the claim, never written. Needs `priority_column`
    /// (highest claimed first); not with a view or limits. `None`: strict
    /// priorities.
    #[serde(default)]
    pub aging: Option<Aging>,
    /// How long the checks wait for a connection before reporting the server
    /// unreachable, with the cause and `host:port`: this one's, and those of
    /// every service built on the table (store, resetter, ...). Default 5 s.
    #[serde(default = "default_connect_timeout", with = "workerutil::duration")]
    pub connect_timeout: Duration,
}

fn default_error_history_limit() -> u32 {
    DEFAULT_ERROR_HISTORY_LIMIT
}

fn default_connect_timeout() -> Duration {
    DEFAULT_CONNECT_TIMEOUT
}

impl JobTableOptions {
    /// `table_name` with the standard columns and no optional one.
    pub fn new(table_name: impl Into<String>) -> JobTableOptions {
        JobTableOptions {
            table_name: table_name.into(),
            view_name: None,
            alternate_column_names: HashMap::new(),
            detect: false,
            queue_column: None,
            kind_column: None,
            key_column: None,
            priority_column: None,
            max_retries_column: None,
            flags_column: None,
            payload_column: None,
            result_column: None,
            error_history_column: None,
            error_history_limit: DEFAULT_ERROR_HISTORY_LIMIT,
            workflows: false,
            pause_table: None,
            limit_table: None,
            limit_key_column: None,
            column_expressions: Vec::new(),
            order_by: None,
            fair: false,
            progress: false,
            traces: false,
            signals: false,
            aging: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// `table_name` with whatever optional columns it has under their
    /// standard names (see [`detect`](Self::detect)): the table `dbworker
    /// migration` printed, whichever flags it was given.
    pub fn detected(table_name: impl Into<String>) -> JobTableOptions {
        JobTableOptions {
            detect: true,
            ..JobTableOptions::new(table_name)
        }
    }

    /// `table_name` with the columns typed jobs need, `kind` and `payload`
    /// (`dbworker migration --typed`): see [`JobArgs`](crate::JobArgs).
    ///
    /// ```
    /// let options = dbworker::JobTableOptions::typed("jobs");
    /// assert_eq!(options.payload_column.as_deref(), Some("payload"));
    /// ```
    pub fn typed(table_name: impl Into<String>) -> JobTableOptions {
        JobTableOptions {
            kind_column: Some("kind".into()),
            payload_column: Some("payload".into()),
            ..JobTableOptions::new(table_name)
        }
    }

    /// Checks every name and combination; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        self.resolve().map(|_| ())
    }

    /// The description with names parsed, before the database is asked.
    pub(crate) fn resolve(&self) -> Result<Table> {
        let invalid = |field: &'static str, reason: &str| Error::InvalidOption {
            field,
            reason: reason.to_owned(),
        };
        let table = Relation::parse("table_name", &self.table_name)?;
        let columns = Columns::resolve(&self.alternate_column_names)?;
        let view = self
            .view_name
            .as_deref()
            .map(|v| Relation::parse("view_name", v))
            .transpose()?;
        let optional = |field: &'static str, name: &Option<String>| -> Result<Option<String>> {
            let Some(name) = name else { return Ok(None) };
            let name = column_name(field, name)?;
            if columns.expected_types().iter().any(|(_, c, _)| *c == name) {
                return Err(Error::InvalidOption {
                    field,
                    reason: format!("{name:?} is one of the standard columns"),
                });
            }
            Ok(Some(name))
        };
        let relation = |field: &'static str, name: &Option<String>| {
            name.as_deref()
                .map(|n| Relation::parse(field, n))
                .transpose()
        };
        if self.error_history_limit == 0 {
            return Err(invalid("error_history_limit", "must be at least 1"));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be positive"));
        }
        Error::check_max_durations([("connect_timeout", self.connect_timeout)])?;
        if self.column_expressions.iter().any(|e| e.trim().is_empty()) {
            return Err(invalid("column_expressions", "an expression is empty"));
        }
        if matches!(&self.order_by, Some(o) if o.trim().is_empty()) {
            return Err(invalid("order_by", "must not be empty when set"));
        }
        let mut t = Table::new(table, columns.clone());
        t.queue_column = optional("queue_column", &self.queue_column)?;
        t.kind_column = optional("kind_column", &self.kind_column)?;
        t.key_column = optional("key_column", &self.key_column)?;
        t.priority_column = optional("priority_column", &self.priority_column)?;
        t.max_retries_column = optional("max_retries_column", &self.max_retries_column)?;
        t.flags_column = optional("flags_column", &self.flags_column)?;
        t.payload_column = optional("payload_column", &self.payload_column)?;
        t.result_column = optional("result_column", &self.result_column)?;
        t.error_history =
            optional("error_history_column", &self.error_history_column)?.map(|column| {
                ErrorHistory {
                    column,
                    limit: self.error_history_limit,
                }
            });
        t.workflows = self.workflows;
        t.pause_table = relation("pause_table", &self.pause_table)?;
        t.limit_table = match relation("limit_table", &self.limit_table)? {
            Some(_) if t.queue_column.is_none() => {
                return Err(invalid(
                    "limit_table",
                    "limits are per queue: set queue_column too",
                ));
            }
            Some(_) if view.is_some() => {
                return Err(invalid(
                    "limit_table",
                    "limits are not supported with a view yet",
                ));
            }
            limits => limits,
        };
        t.limit_key_column = match &self.limit_key_column {
            Some(_) if t.limit_table.is_none() => {
                return Err(invalid("limit_key_column", "set limit_table too"));
            }
            Some(column) => Some(column_name("limit_key_column", column)?),
            None => None,
        };
        t.view = view;
        t.column_expressions = self.column_expressions.clone();
        t.order_by = self.order_by.clone();
        if let Some(aging) = &self.aging {
            aging.validate()?;
            if t.priority_column.is_none() {
                return Err(invalid(
                    "aging",
                    "aging raises priorities: set priority_column too",
                ));
            }
            if t.view.is_some() || t.limit_table.is_some() {
                return Err(invalid(
                    "aging",
                    "aging is not supported with a view or a limit table yet",
                ));
            }
            t.aging = Some(crate::sql::AgingParams {
                interval_secs: aging.interval.as_secs_f64(),
                max_boost: aging.max_boost,
            });
        }
        t.progress = self.progress;
        t.traces = self.traces;
        t.signals = self
            .signals
            .then(|| crate::columns::signals_table(&t.table));
        t.fair_weights = self
            .fair
            .then(|| crate::columns::fair_weights_table(&t.table));
        Ok(t)
    }
}

/// One job table, validated and checked against the database: what every
/// service takes. Cheap to clone (the description is shared).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::{Enqueuer, JobTable, JobTableOptions, Resetter, ResetterOptions};
/// // Checked now: a missing table, column, index or privilege is named here.
/// let jobs = JobTable::new(&pool, JobTableOptions::typed("jobs")).await?;
/// let enqueuer = Enqueuer::new(&pool, &jobs).await?;
/// let resetter = Resetter::new(&pool, &jobs, ResetterOptions::default()).await?;
/// # let _ = (enqueuer, resetter); Ok(()) }
/// ```
#[derive(Clone)]
pub struct JobTable {
    t: Arc<Table>,
    /// How long every start-up check over this table waits for a connection.
    connect_timeout: Duration,
}

impl fmt::Debug for JobTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobTable")
            .field("table", &self.t.table.display_name())
            .field("view", &self.t.view.as_ref().map(Relation::display_name))
            .field("queue_column", &self.t.queue_column)
            .field("kind_column", &self.t.kind_column)
            .field("key_column", &self.t.key_column)
            .field("payload_column", &self.t.payload_column)
            .field("workflows", &self.t.workflows)
            .finish_non_exhaustive()
    }
}

impl JobTable {
    /// Validates `options`, then checks the table against the database: the
    /// relation and the view exist and the role may read them (`SELECT` is
    /// all a table needs: each service that writes checks its own grants),
    /// every standard column (renamed as configured) and every named optional
    /// column exists with a usable type, a key column has its unique index,
    /// the control tables exist. Every problem is reported together in one
    /// [`Error::Schema`]; an unreachable server as [`Error::Connect`] within
    /// `connect_timeout`.
    pub async fn new(pool: &PgPool, options: JobTableOptions) -> Result<JobTable> {
        let mut t = options.resolve()?;
        crate::schema_check::probe_connection(pool, options.connect_timeout).await?;
        check::check(pool, &mut t, options.detect).await?;
        Ok(JobTable {
            t: Arc::new(t),
            connect_timeout: options.connect_timeout,
        })
    }

    /// How long the start-up checks of every service over this table wait
    /// for a connection ([`JobTableOptions::connect_timeout`]): the one
    /// connect timeout of a table's services.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The table's name as written in SQL (schema-qualified when it was).
    pub fn name(&self) -> String {
        self.t.table.display_name()
    }

    /// The pause table its claims honour, if any: the one the options name,
    /// else `dbworker_pauses` when it exists (see [`crate::control::Pauses`]).
    pub fn pause_table(&self) -> Option<String> {
        self.t.pause_table.as_ref().map(|r| r.display_name())
    }

    /// The limit table its claims honour, if any: the one the options name,
    /// else `dbworker_limits` when it exists and the table has a queue column
    /// (not through a view nor with aging, which limits do not support).
    pub fn limit_table(&self) -> Option<String> {
        self.t.limit_table.as_ref().map(|r| r.display_name())
    }

    /// What its claims honour, as the registry records it
    /// ([`NodeOptions::honours`](crate::cluster::NodeOptions::honours)):
    /// `pauses in dbworker_pauses`, `limits in dbworker_limits`.
    pub fn honours(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p) = self.pause_table() {
            out.push(format!("pauses in {p}"));
        }
        if let Some(l) = self.limit_table() {
            out.push(format!("limits in {l}"));
        }
        out
    }

    /// The id column's name.
    pub(crate) fn id_column(&self) -> &str {
        &self.t.columns.id
    }

    /// The queue column, if the table has one.
    pub fn queue_column(&self) -> Option<&str> {
        self.t.queue_column.as_deref()
    }

    /// The kind column, if the table has one.
    pub fn kind_column(&self) -> Option<&str> {
        self.t.kind_column.as_deref()
    }

    /// The job key column, if the table has one.
    pub fn key_column(&self) -> Option<&str> {
        self.t.key_column.as_deref()
    }

    /// The `jsonb` payload column, if the table has one.
    pub fn payload_column(&self) -> Option<&str> {
        self.t.payload_column.as_deref()
    }

    /// Whether jobs keep progress and checkpoints, in the table's columns
    /// (`dbworker migration --progress`) or its side table (`--progress-table`).
    pub fn has_progress(&self) -> bool {
        self.t.keeps_progress()
    }

    /// Whether jobs carry their trace context (`dbworker migration --traces`).
    pub fn has_traces(&self) -> bool {
        self.t.traces
    }

    /// Whether jobs may wait for signals (`dbworker migration --signals`).
    pub fn has_signals(&self) -> bool {
        self.t.signals.is_some()
    }

    /// Whether claims are fair across keys (`dbworker migration --fair`).
    pub fn is_fair(&self) -> bool {
        self.t.fair_weights.is_some()
    }

    /// Whether the table has workflows.
    pub fn has_workflows(&self) -> bool {
        self.t.workflows
    }

    /// The resolved description every statement reads.
    pub(crate) fn sql(&self) -> &Arc<Table> {
        &self.t
    }

    /// This table read with `column_expressions` instead of its own (a
    /// client's typed select): the same checked description otherwise.
    pub(crate) fn reading(&self, column_expressions: Vec<String>) -> JobTable {
        let mut t = (*self.t).clone();
        t.column_expressions = column_expressions;
        JobTable {
            t: Arc::new(t),
            connect_timeout: self.connect_timeout,
        }
    }

    /// What stores read of each claimed row
    /// ([`JobTableOptions::column_expressions`]; empty: `alias.*`).
    pub fn column_expressions(&self) -> &[String] {
        &self.t.column_expressions
    }

    /// The job table's relation.
    pub(crate) fn relation(&self) -> &Relation {
        &self.t.table
    }

    /// A description not checked against a database, for unit tests of the
    /// services' option handling.
    #[cfg(test)]
    pub(crate) fn unchecked(options: JobTableOptions) -> Result<JobTable> {
        Ok(JobTable {
            t: Arc::new(options.resolve()?),
            connect_timeout: options.connect_timeout,
        })
    }
}
