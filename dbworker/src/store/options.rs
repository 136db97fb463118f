//! `StoreOptions`: how a `DbStore` maps onto an application's job table.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgRow;
use workerutil::BoxError;

use crate::columns::{Columns, Relation, column_name};
use crate::error::Error;
use crate::notify::Listen;
use crate::retry::RetryPolicy;
use crate::sql::{JobTable, PerJob};

use super::ForbiddenFlags;
use super::resolved::Resolved;

/// Turns one selected row (the values of `column_expressions`, in order) into a record.
pub type ScanFn<R> = Arc<dyn Fn(&PgRow) -> Result<R, BoxError> + Send + Sync>;

/// How the handler's work relates to the job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Handling {
    /// The handler runs inside a transaction that locks the job row (`FOR KEY
    /// SHARE`); what it writes through [`DbJob::tx`](crate::DbJob::tx) commits
    /// atomically with the job's final state, and is rolled back if the job
    /// fails. Holds one connection per running handler. The default.
    #[default]
    Transactional,
    /// No transaction is held while the handler runs; heartbeats keep the row
    /// alive and the final mark is its own statement. For long jobs.
    Heartbeat,
}

/// Configures a [`DbStore`](crate::DbStore) for one job table.
///
/// ```
/// use dbworker::{StoreOptions, Handling};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
/// let mut options = StoreOptions::<Job>::from_row("example_job_store", "example_jobs j");
/// options.column_expressions = vec!["j.id::bigint AS id".into()];
/// options.order_by = Some("j.id".into());
/// options.max_num_retries = 3;
/// assert!(options.validate().is_ok());
/// ```
#[non_exhaustive]
pub struct StoreOptions<R> {
    /// The store's name, used in logs and spans. Required.
    pub name: String,
    /// The job table, optionally schema-qualified and with an alias:
    /// `"example_jobs"`, `"app.example_jobs j"`. Claims and state changes
    /// run on this table. A name that SQL must quote (a keyword, capitals,
    /// spaces) is written double-quoted, as in SQL: `"\"order\" o"`; so are
    /// column options such as `queue_column`.
    pub table_name: String,
    /// A view (with alias) the handler's record is read from, e.g. one joining
    /// the job table to related tables. `None` reads from the table. The view must
    /// expose the job table's `id` (renamed per `alternate_column_names`),
    /// `state` and `process_after` columns.
    pub view_name: Option<String>,
    /// SQL expressions selected from the view (or table) for each record, in the
    /// order `scan` reads them, e.g. `["j.id", "j.payload", "r.name"]`. Empty
    /// selects `alias.*`, which suits a [`StoreOptions::from_row`] record.
    pub column_expressions: Vec<String>,
    /// Reads a record from a selected row.
    pub scan: ScanFn<R>,
    /// An SQL `ORDER BY` expression over the view's (or table's) alias giving
    /// dequeue priority, e.g. `"j.priority DESC, j.id"`. `None` orders by id.
    pub order_by: Option<String>,
    /// Renames standard columns: `{"state": "status"}` makes every statement use
    /// `status` where it would use `state`.
    pub alternate_column_names: HashMap<String, String>,
    /// How many times an errored job is retried before it fails for good; a job
    /// gets at most `max_num_retries + 1` attempts. Default
    /// [`DEFAULT_MAX_NUM_RETRIES`] (10): with the default [`RetryPolicy`] the
    /// retries span about 2.4 hours. 0 disables retries: a retryable error fails
    /// the job.
    pub max_num_retries: u32,
    /// A nullable integer column holding a per-job `max_num_retries` (set by
    /// [`NewJob::max_retries`](crate::NewJob::max_retries); `dbworker migration
    /// --max-retries` adds `max_retries`). NULL, or no column: `max_num_retries`.
    pub max_retries_column: Option<String>,
    /// The delay before each retry.
    pub retry: RetryPolicy,
    /// A processing job whose heartbeat is older than this, and whose row no
    /// live transaction locks, is stalled: the resetter requeues or fails it.
    /// Must exceed the worker's heartbeat interval comfortably. Default 30 s.
    pub stalled_max_age: Duration,
    /// How many times a stalled job is requeued before the resetter fails it
    /// (a job that keeps killing its worker is poison). Default 3.
    pub max_num_resets: u32,
    /// The failure message of a job failed by the resetter.
    pub reset_failure_message: String,
    /// Transactional (default) or heartbeat handling.
    pub handling: Handling,
    /// With a view, how many candidate rows (beyond the requested batch) the
    /// claim considers before locking rows of the table. Default 50.
    pub candidate_window: usize,
    /// The claim cursor's probe interval. Claims start their index scan at
    /// the lowest id that can still be eligible (just past what this store
    /// claimed last; one cursor per set of `pre_dequeue` conditions and
    /// forbidden flags) instead of walking, from the table's first row, over
    /// the dead index entries of every row claimed since the last vacuum, which a long-running
    /// transaction elsewhere (an analytics query, a forgotten `BEGIN`) keeps
    /// in the index. A row that becomes eligible behind the cursor takes it
    /// back at once when the store learns its id: its own retries, requeues
    /// and `reset_stalled`, and with [`listen`](Self::listen) each
    /// notification of the NOTIFY trigger (a row put back, the lowest id of an
    /// insert that committed after claims passed it). Anything else (a
    /// scheduled job coming due, a row a condition passed over) is found by a
    /// probe beside the claims that looks behind the cursor once per interval,
    /// takes it back and wakes the workers, so it is claimed at most about
    /// this long later; while the probe's looks are slow (many dead entries
    /// below the cursor) it starts at most once per 10 × its last duration.
    /// Applies when jobs are claimed in id order without a view (the default
    /// `order_by`) and without a pause table (a paused queue's rows are passed
    /// over, not taken); with a limit table, a claim that a limit binds
    /// (some queue has less room than the claim may take) leaves the cursor
    /// where it was, for the same reason. `None` scans from the start every
    /// time. At least 10 ms. Default 1 s.
    pub claim_cursor: Option<Duration>,
    /// Wake idle workers with LISTEN/NOTIFY instead of waiting for their next
    /// poll. The store then holds one extra connection of its own (outside the
    /// pool, so it needs a session connection: not PgBouncer's transaction
    /// pooling), reconnects it by itself, and workers poll while it is down.
    /// The table must be notified: install [`notify_trigger_sql`](crate::ddl::notify_trigger_sql)
    /// (or call `pg_notify(channel, lowest_id::text)` where you enqueue).
    /// Default [`Listen::Off`].
    pub listen: Listen,
    /// How long `DbStore::new` (and the listener) wait for a connection before
    /// reporting the server unreachable, with the real cause (refused, name
    /// lookup, authentication) and `host:port`. Default 5 s.
    pub connect_timeout: Duration,
    /// The pause table (`dbworker migration --pauses` creates
    /// `dbworker_pauses`): claims skip the whole table while it is paused, and
    /// a queue while that queue is (with `queue_column`). Checked at start-up.
    /// `None` (the default): pauses are not consulted.
    pub pause_table: Option<String>,
    /// The table's queue column, for per-queue pauses and limits.
    pub queue_column: Option<String>,
    /// The limit table (`dbworker migration --limits` creates
    /// `dbworker_limits`): per queue, at most `max_processing` jobs processing
    /// at once across every process, at most `max_per_key` per key, and at
    /// most `rate_per_second` started per second, enforced by the claim
    /// itself (claims of this table then take a transaction-scoped advisory
    /// lock, so they serialize). Needs `queue_column`; every store on the
    /// table must set it. Checked at start-up. `None` (the default): no limits.
    pub limit_table: Option<String>,
    /// The column whose value is the key of per-key limits (`max_per_key`),
    /// for example `customer_id` or the job key column. Needs `limit_table`.
    /// `None` (the default): per-key limits are not enforced.
    pub limit_key_column: Option<String>,
    /// The `text[]` column holding each job's flags (`dbworker migration
    /// --flags` adds `flags`), over the view's (or table's) alias. Needed by
    /// `forbidden_flags`; checked at start-up.
    pub flags_column: Option<String>,
    /// Claims skip jobs carrying any of these flags: a fixed list, or a
    /// callback asked before each claim (it must answer from a cache; see
    /// [`ForbiddenFlags::callback`]). Needs `flags_column`. `None` (the
    /// default): flags are not consulted.
    pub forbidden_flags: Option<ForbiddenFlags>,
    /// The `jsonb` column holding each job's payload, which batch jobs
    /// ([`BatchJobs`](crate::batch::BatchJobs)) rewrite with the items left to
    /// retry, in their errored mark ([`DbJob::retry_with_payload`](crate::DbJob::retry_with_payload)).
    /// Checked at start-up. `None` (the default): payloads are never rewritten.
    pub payload_column: Option<String>,
    /// The `jsonb` column holding each job's per-attempt error history
    /// (`dbworker migration --error-history` adds `errors`): every failing
    /// mark (errored, failed, a reset, a requeue after a lost connection)
    /// appends `{attempt, at, message, worker}` in the same fenced statement,
    /// `at` from the database clock. Checked at start-up. `None` (the
    /// default): no history is kept.
    pub error_history_column: Option<String>,
    /// With `error_history_column`: the most entries a job keeps, the oldest
    /// dropped first. At least 1. Default [`DEFAULT_ERROR_HISTORY_LIMIT`] (20).
    pub error_history_limit: u32,
    /// The `jsonb` column a completion writes the handler's result to
    /// ([`DbJob::set_result`](crate::DbJob::set_result); `dbworker migration
    /// --results` adds `result`), in the completion's own statement (and so
    /// transaction). Checked at start-up. `None` (the default): results are refused.
    pub result_column: Option<String>,
    /// With `result_column`: the largest result, in bytes of its JSON text.
    /// A larger one is refused by `set_result`, and fails the job with a
    /// message naming its size and the cap. Default [`DEFAULT_MAX_RESULT_BYTES`] (64 KiB).
    pub max_result_bytes: usize,
}

impl<R> fmt::Debug for StoreOptions<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("name", &self.name)
            .field("table_name", &self.table_name)
            .field("view_name", &self.view_name)
            .field("column_expressions", &self.column_expressions)
            .field("order_by", &self.order_by)
            .field("alternate_column_names", &self.alternate_column_names)
            .field("max_num_retries", &self.max_num_retries)
            .field("retry", &self.retry)
            .field("stalled_max_age", &self.stalled_max_age)
            .field("max_num_resets", &self.max_num_resets)
            .field("reset_failure_message", &self.reset_failure_message)
            .field("handling", &self.handling)
            .field("candidate_window", &self.candidate_window)
            .field("claim_cursor", &self.claim_cursor)
            .field("max_retries_column", &self.max_retries_column)
            .field("pause_table", &self.pause_table)
            .field("queue_column", &self.queue_column)
            .field("limit_table", &self.limit_table)
            .field("limit_key_column", &self.limit_key_column)
            .field("flags_column", &self.flags_column)
            .field("forbidden_flags", &self.forbidden_flags)
            .field("payload_column", &self.payload_column)
            .field("error_history_column", &self.error_history_column)
            .field("error_history_limit", &self.error_history_limit)
            .field("result_column", &self.result_column)
            .field("max_result_bytes", &self.max_result_bytes)
            .field("listen", &self.listen)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl<R> Clone for StoreOptions<R> {
    fn clone(&self) -> Self {
        StoreOptions {
            name: self.name.clone(),
            table_name: self.table_name.clone(),
            view_name: self.view_name.clone(),
            column_expressions: self.column_expressions.clone(),
            scan: self.scan.clone(),
            order_by: self.order_by.clone(),
            alternate_column_names: self.alternate_column_names.clone(),
            max_num_retries: self.max_num_retries,
            max_retries_column: self.max_retries_column.clone(),
            retry: self.retry.clone(),
            stalled_max_age: self.stalled_max_age,
            max_num_resets: self.max_num_resets,
            reset_failure_message: self.reset_failure_message.clone(),
            handling: self.handling,
            candidate_window: self.candidate_window,
            claim_cursor: self.claim_cursor,
            listen: self.listen.clone(),
            pause_table: self.pause_table.clone(),
            queue_column: self.queue_column.clone(),
            limit_table: self.limit_table.clone(),
            limit_key_column: self.limit_key_column.clone(),
            flags_column: self.flags_column.clone(),
            forbidden_flags: self.forbidden_flags.clone(),
            payload_column: self.payload_column.clone(),
            error_history_column: self.error_history_column.clone(),
            error_history_limit: self.error_history_limit,
            result_column: self.result_column.clone(),
            max_result_bytes: self.max_result_bytes,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// The default `max_num_retries`. Retryable errors are mostly transient (an
/// upstream that is down, a database failover in heartbeat handling): with the
/// default backoff (10 s, doubling, capped at 1 h) ten retries ride out about
/// 2.4 hours of trouble, yet a job that can never succeed still ends `failed`
/// the same day.
pub const DEFAULT_MAX_NUM_RETRIES: u32 = 10;

/// The default `max_result_bytes`: results are meant for what a downstream
/// task needs (ids, counts, a summary), not for bulk data.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 * 1024;

/// The default `error_history_limit`: enough attempts to see a pattern
/// (the default `max_num_retries` gives 11), small enough to keep rows narrow.
pub const DEFAULT_ERROR_HISTORY_LIMIT: u32 = 20;

/// The default `connect_timeout` of the store and the resetter.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default `reset_failure_message`.
pub const DEFAULT_RESET_FAILURE_MESSAGE: &str =
    "job processor died while handling this job too many times";

impl<R> StoreOptions<R> {
    /// Options for `table_name` with a custom scan function; every other field
    /// at its default.
    pub fn new(
        name: impl Into<String>,
        table_name: impl Into<String>,
        scan: impl Fn(&PgRow) -> Result<R, BoxError> + Send + Sync + 'static,
    ) -> Self {
        StoreOptions {
            name: name.into(),
            table_name: table_name.into(),
            view_name: None,
            column_expressions: Vec::new(),
            scan: Arc::new(scan),
            order_by: None,
            alternate_column_names: HashMap::new(),
            max_num_retries: DEFAULT_MAX_NUM_RETRIES,
            retry: RetryPolicy::default(),
            stalled_max_age: Duration::from_secs(30),
            max_num_resets: 3,
            reset_failure_message: DEFAULT_RESET_FAILURE_MESSAGE.to_owned(),
            handling: Handling::Transactional,
            candidate_window: 50,
            claim_cursor: Some(Duration::from_secs(1)),
            max_retries_column: None,
            listen: Listen::Off,
            pause_table: None,
            queue_column: None,
            limit_table: None,
            limit_key_column: None,
            flags_column: None,
            forbidden_flags: None,
            payload_column: None,
            error_history_column: None,
            error_history_limit: DEFAULT_ERROR_HISTORY_LIMIT,
            result_column: None,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Checks every field and resolves names; the first problem is returned.
    pub fn validate(&self) -> Result<(), Error> {
        self.resolve().map(|_| ())
    }

    pub(crate) fn resolve(&self) -> Result<Resolved, Error> {
        fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
            Error::InvalidOption {
                field,
                reason: reason.into(),
            }
        }
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        let table = Relation::parse("table_name", &self.table_name)?;
        let view = match &self.view_name {
            Some(v) => Some(Relation::parse("view_name", v)?),
            None => None,
        };
        let columns = Columns::resolve(&self.alternate_column_names)?;
        if self.column_expressions.iter().any(|e| e.trim().is_empty()) {
            return Err(invalid("column_expressions", "an expression is empty"));
        }
        if matches!(&self.order_by, Some(o) if o.trim().is_empty()) {
            return Err(invalid("order_by", "must not be empty when set"));
        }
        let r = &self.retry;
        if !(r.backoff_factor.is_finite() && r.backoff_factor >= 1.0) {
            return Err(invalid(
                "retry.backoff_factor",
                "must be a finite number >= 1.0",
            ));
        }
        if !(r.jitter.is_finite() && (0.0..1.0).contains(&r.jitter)) {
            return Err(invalid("retry.jitter", "must be in [0, 1)"));
        }
        if r.max_delay < r.retry_after {
            return Err(invalid(
                "retry.max_delay",
                "must be at least retry.retry_after",
            ));
        }
        if self.stalled_max_age < Duration::from_millis(100) {
            return Err(invalid("stalled_max_age", "must be at least 100ms"));
        }
        if self.reset_failure_message.trim().is_empty() {
            return Err(invalid("reset_failure_message", "must not be empty"));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be positive"));
        }
        if self.candidate_window == 0 {
            return Err(invalid("candidate_window", "must be at least 1"));
        }
        if matches!(self.claim_cursor, Some(d) if d < Duration::from_millis(10)) {
            return Err(invalid("claim_cursor", "must be at least 10ms"));
        }
        let pause_table = match &self.pause_table {
            Some(name) => Some(Relation::parse("pause_table", name)?),
            None => None,
        };
        let queue_column = self
            .queue_column
            .as_deref()
            .map(|column| column_name("queue_column", column))
            .transpose()?;
        let limit_table = match &self.limit_table {
            Some(_) if self.queue_column.is_none() => {
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
            Some(name) => Some(Relation::parse("limit_table", name)?),
            None => None,
        };
        let limit_key_column = match &self.limit_key_column {
            Some(_) if limit_table.is_none() => {
                return Err(invalid("limit_key_column", "set limit_table too"));
            }
            Some(column) => Some(column_name("limit_key_column", column)?),
            None => None,
        };
        let flags_column = self
            .flags_column
            .as_deref()
            .map(|column| column_name("flags_column", column))
            .transpose()?;
        if self.forbidden_flags.is_some() && flags_column.is_none() {
            return Err(invalid("forbidden_flags", "set flags_column too"));
        }
        if let Some(flags) = &self.forbidden_flags {
            flags.check()?;
        }
        let max_retries_column = self
            .max_retries_column
            .as_deref()
            .map(|column| column_name("max_retries_column", column))
            .transpose()?;
        if let Some(column) = &max_retries_column
            && columns
                .expected_types()
                .iter()
                .any(|(_, name, _)| *name == column.as_str())
        {
            return Err(invalid(
                "max_retries_column",
                "must not be one of the standard columns",
            ));
        }
        let payload_column = self
            .payload_column
            .as_deref()
            .map(|column| column_name("payload_column", column))
            .transpose()?;
        let error_history = error_history(
            self.error_history_column.as_deref(),
            self.error_history_limit,
        )?;
        let result_column = self
            .result_column
            .as_deref()
            .map(|column| column_name("result_column", column))
            .transpose()?;
        if self.max_result_bytes == 0 {
            return Err(invalid("max_result_bytes", "must be at least 1"));
        }
        let listen_channel = self.listen.resolve(&table)?;
        // The cursor is an id: it needs claims in id order over the table. A
        // paused queue's rows are passed over without being taken, and come
        // back with no event the store sees, so those claims scan in full. (A
        // limited claim passes rows over only when a limit binds it, and such
        // a claim leaves the cursor where it was.)
        let claim_cursor = self
            .claim_cursor
            .filter(|_| view.is_none() && self.order_by.is_none() && pause_table.is_none());
        let view_or_table = view.clone().unwrap_or_else(|| table.clone());
        let order_by = self.order_by.clone().unwrap_or_else(|| {
            format!(
                "{}.{}",
                crate::columns::quote(&view_or_table.alias),
                crate::columns::quote(&columns.id)
            )
        });
        let column_expressions = if self.column_expressions.is_empty() {
            vec![format!("{}.*", crate::columns::quote(&view_or_table.alias))]
        } else {
            self.column_expressions.clone()
        };
        let sql = JobTable {
            table,
            view,
            columns,
            column_expressions,
            order_by,
            max_num_retries: self.max_num_retries,
            max_retries_column,
            retry: self.retry.clone(),
            max_num_resets: self.max_num_resets,
            candidate_window: self.candidate_window,
            pause_table,
            limit_table,
            limit_key_column,
            queue_column,
            flags_column,
            payload_column,
            error_history,
            result_column,
        };
        Ok(Resolved {
            name: self.name.clone(),
            per_job: PerJob::new(&sql),
            sql,
            max_result_bytes: self.max_result_bytes,
            forbidden_flags: self.forbidden_flags.clone(),
            stalled_max_age: self.stalled_max_age,
            reset_failure_message: self.reset_failure_message.clone(),
            handling: self.handling,
            claim_cursor,
            listen_channel,
            connect_timeout: self.connect_timeout,
        })
    }
}

/// The error history's column and cap, checked (the store's and the resetter's).
pub(crate) fn error_history(
    column: Option<&str>,
    limit: u32,
) -> Result<Option<crate::sql::ErrorHistory>, Error> {
    if limit == 0 {
        return Err(Error::InvalidOption {
            field: "error_history_limit",
            reason: "must be at least 1".to_owned(),
        });
    }
    Ok(match column {
        Some(column) => Some(crate::sql::ErrorHistory {
            column: column_name("error_history_column", column)?,
            limit,
        }),
        None => None,
    })
}

impl<R> StoreOptions<R>
where
    R: for<'r> sqlx::FromRow<'r, PgRow>,
{
    /// Options whose records are read with `R`'s `sqlx::FromRow` impl, so no scan
    /// code is needed; `column_expressions` defaults to `alias.*`.
    pub fn from_row(name: impl Into<String>, table_name: impl Into<String>) -> Self {
        StoreOptions::new(name, table_name, |row: &PgRow| {
            R::from_row(row).map_err(|e| Box::new(e) as BoxError)
        })
    }
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
