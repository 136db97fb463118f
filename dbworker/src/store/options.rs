//! `StoreOptions`: how a `DbStore` reads, claims, retries and marks a job table's jobs.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgRow;
use workerutil::BoxError;

use crate::columns::quote;
use crate::error::Error;
use crate::notify::Listen;
use crate::retry::RetryPolicy;
use crate::sql::{PerJob, StoreParams};
use crate::table::JobTable;

use super::ForbiddenFlags;
use super::resolved::Resolved;

/// Turns one selected row (the values of the table's
/// [`column_expressions`](crate::JobTableOptions::column_expressions), in
/// order) into a record.
pub(crate) type ScanFn<R> = Arc<dyn Fn(&PgRow) -> Result<R, BoxError> + Send + Sync>;

/// How the handler's work relates to the job row. In a config file,
/// `"transactional"` or `"heartbeat"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// How a [`DbStore`](crate::DbStore) reads, claims, retries and marks the jobs
/// of a [`JobTable`](crate::JobTable): behaviour only; the table is described
/// once, by the `JobTable` the store is built on.
///
/// ```
/// use dbworker::{StoreOptions, Handling};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
/// let mut options = StoreOptions::new("example_job_store");
/// options.max_num_retries = 3;
/// assert!(options.validate().is_ok());
/// ```
///
/// Plain data, deserializable from a config file (how records are read is
/// the store's: `sqlx::FromRow`, or a scan given to
/// [`DbStore::with_scan`](crate::DbStore::with_scan)): `name` is required,
/// every other field left out keeps its default, durations are written as in
/// [`workerutil::duration`], and an unknown field is refused.
///
/// ```
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// let options: dbworker::StoreOptions = serde_json::from_str(r#"{
///     "name": "emails",
///     "handling": "heartbeat",
///     "stall": { "stalled_max_age": "2m" },
///     "claim": { "forbidden_flags": ["gpu"] }
/// }"#).unwrap();
/// assert_eq!(options.stall.stalled_max_age, std::time::Duration::from_secs(120));
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreOptions {
    /// The store's name, used in logs and spans. Required.
    pub name: String,
    /// Transactional (default) or heartbeat handling.
    #[serde(default)]
    pub handling: Handling,
    /// How many times an errored job is retried before it fails for good; a job
    /// gets at most `max_num_retries + 1` attempts (a table's
    /// `max_retries_column` overrides it per job). Default
    /// [`DEFAULT_MAX_NUM_RETRIES`] (10): with the default [`RetryPolicy`] the
    /// retries span about 2.4 hours. 0 disables retries: a retryable error fails
    /// the job.
    #[serde(default = "default_max_num_retries")]
    pub max_num_retries: u32,
    /// The delay before each retry.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// When a processing job counts as stalled and how often it may be reset:
    /// give a [`Resetter`](crate::Resetter) of the table the same values.
    #[serde(default)]
    pub stall: StallOptions,
    /// Which jobs a claim takes, in what order.
    #[serde(default)]
    pub claim: ClaimOptions,
    /// Wake idle workers with LISTEN/NOTIFY instead of waiting for their next
    /// poll. The store then holds one extra connection of its own (outside the
    /// pool, so it needs a session connection: behind PgBouncer's transaction
    /// pooling, the `listen_url` of [`Pooler::Transaction`](crate::Pooler),
    /// else workers poll), reconnects it by itself, and workers poll while it
    /// is down.
    /// The table must be notified: install [`notify_trigger_sql`](crate::ddl::notify_trigger_sql)
    /// (or call `pg_notify(channel, lowest_id::text)` where you enqueue).
    /// Default [`Listen::Off`].
    #[serde(default)]
    pub listen: Listen,
    /// With the table's `result_column`: the largest result, in bytes of its
    /// JSON text. A larger one is refused by `set_result`, and fails the job
    /// with a message naming its size and the cap. Default
    /// [`DEFAULT_MAX_RESULT_BYTES`] (64 KiB).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
}

/// The defaults of the `StoreOptions` fields a config file leaves out.
fn default_max_num_retries() -> u32 {
    DEFAULT_MAX_NUM_RETRIES
}

fn default_max_result_bytes() -> usize {
    DEFAULT_MAX_RESULT_BYTES
}

/// When a processing job is stalled, and what becomes of it: shared by a
/// store (its own resets and requeues after a lost connection) and the
/// [`Resetter`](crate::Resetter) of the same table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StallOptions {
    /// A processing job whose heartbeat is older than this, and whose row no
    /// live transaction locks, is stalled: the resetter requeues or fails it.
    /// Must exceed the worker's heartbeat interval comfortably. At least
    /// 100 ms. Default 30 s.
    #[serde(with = "workerutil::duration")]
    pub stalled_max_age: Duration,
    /// How many times a stalled job is requeued before it is failed (a job
    /// that keeps killing its worker is poison). Default 3.
    pub max_num_resets: u32,
    /// The failure message of a job failed for too many resets.
    pub reset_failure_message: String,
}

impl Default for StallOptions {
    fn default() -> Self {
        StallOptions {
            stalled_max_age: Duration::from_secs(30),
            max_num_resets: 3,
            reset_failure_message: DEFAULT_RESET_FAILURE_MESSAGE.to_owned(),
        }
    }
}

impl StallOptions {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), Error> {
        // The resetter adds it to the registry's `dead_after`.
        Error::check_max_durations([("stalled_max_age", self.stalled_max_age)])?;
        if self.stalled_max_age < Duration::from_millis(100) {
            return Err(invalid("stalled_max_age", "must be at least 100ms"));
        }
        if self.reset_failure_message.trim().is_empty() {
            return Err(invalid("reset_failure_message", "must not be empty"));
        }
        Ok(())
    }
}

/// Which jobs a store's claims take, and in what order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClaimOptions {
    /// With a view, how many candidate rows (beyond the requested batch) the
    /// claim considers before locking rows of the table. At most 1,000,000.
    /// Default 50.
    pub candidate_window: usize,
    /// The claim cursor's probe interval. Claims start their index scan at
    /// the lowest id that can still be eligible (just past what this store
    /// claimed last; one cursor per set of `pre_dequeue` conditions and
    /// forbidden flags) instead of walking, from the table's first row, over
    /// the dead index entries of every row claimed since the last vacuum, which a long-running
    /// transaction elsewhere (an analytics query, a forgotten `BEGIN`) keeps
    /// in the index. A row that becomes eligible behind the cursor takes it
    /// back at once when the store learns its id: its own retries, requeues
    /// and `reset_stalled`, and with [`listen`](StoreOptions::listen) each
    /// notification of the NOTIFY trigger (a row put back, the lowest id of an
    /// insert that committed after claims passed it). Anything else (a
    /// scheduled job coming due, a row a condition passed over) is found by a
    /// probe beside the claims that looks behind the cursor once per interval,
    /// takes it back and wakes the workers, so it is claimed at most about
    /// this long later. While a worker waits for a wake-up, a listening
    /// store's probe also looks for a job that came due since its last look
    /// (announced by nothing), at any id, and wakes the worker, however far
    /// its poll backed off (`max_interval`); like an empty claim, that look
    /// reads past every queued job. A listening store whose claims
    /// cannot use a cursor (below) runs the probe at this interval for that
    /// alone (through a view, the look reads the view). While the probe's looks are
    /// slow (many dead entries below the cursor, or many jobs scheduled for
    /// later) it starts at most once per
    /// 10 × the fastest of its last three looks (one look slowed by a busy
    /// machine stretches nothing).
    /// Applies when jobs are claimed in id order without a view (the default
    /// [`JobTableOptions::order_by`](crate::JobTableOptions::order_by)) and without a pause table (a paused queue's rows are passed
    /// over, not taken); with a limit table, a claim that a limit binds
    /// (some queue has less room than the claim may take) leaves the cursor
    /// where it was, for the same reason. `None` scans from the start every
    /// time and runs no probe, so jobs coming due wait for the workers'
    /// polls (`"off"` in a config file). At least 10 ms. Default 1 s.
    #[serde(with = "workerutil::duration::option")]
    pub claim_cursor: Option<Duration>,
    /// Claims skip jobs carrying any of these flags: a fixed list, or a
    /// callback asked before each claim (it must answer from a cache; see
    /// [`ForbiddenFlags::callback`]). Needs the table's `flags_column`.
    /// `None` (the default): flags are not consulted. In a config file, a
    /// list of strings: the fixed flags.
    #[serde(with = "fixed_flags")]
    pub forbidden_flags: Option<ForbiddenFlags>,
}

/// `ClaimOptions::forbidden_flags` in a config file: a list of strings, the
/// fixed flags. A callback cannot be written.
mod fixed_flags {
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::ForbiddenFlags;

    pub(super) fn serialize<S: Serializer>(
        flags: &Option<ForbiddenFlags>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match flags {
            None => serializer.serialize_none(),
            Some(ForbiddenFlags::Fixed(flags)) => serializer.collect_seq(flags),
            Some(_) => Err(S::Error::custom(
                "forbidden_flags holds a callback, which a config file cannot hold",
            )),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<ForbiddenFlags>, D::Error> {
        Ok(Option::<Vec<String>>::deserialize(deserializer)?.map(ForbiddenFlags::Fixed))
    }
}

impl Default for ClaimOptions {
    fn default() -> Self {
        ClaimOptions {
            candidate_window: 50,
            claim_cursor: Some(Duration::from_secs(1)),
            forbidden_flags: None,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        field,
        reason: reason.into(),
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

/// The default `reset_failure_message`.
pub const DEFAULT_RESET_FAILURE_MESSAGE: &str =
    "job processor died while handling this job too many times";

impl StoreOptions {
    /// Options named `name` (in logs and spans), every other field at its
    /// default.
    pub fn new(name: impl Into<String>) -> Self {
        StoreOptions {
            name: name.into(),
            handling: Handling::Transactional,
            max_num_retries: DEFAULT_MAX_NUM_RETRIES,
            retry: RetryPolicy::default(),
            stall: StallOptions::default(),
            claim: ClaimOptions::default(),
            listen: Listen::Off,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }

    /// Checks every field (the table's are checked by its `JobTable`); the
    /// first problem is returned.
    pub fn validate(&self) -> Result<(), Error> {
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
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
        if r.max_delay > workerutil::duration::MAX {
            return Err(invalid("retry.max_delay", "must be at most 100 years"));
        }
        self.stall.validate()?;
        let c = &self.claim;
        if c.candidate_window == 0 {
            return Err(invalid("candidate_window", "must be at least 1"));
        }
        // Added to the batch size for the window's `LIMIT`: bounded, the sum
        // cannot overflow, and no claim reads more candidates than that.
        if c.candidate_window > 1_000_000 {
            return Err(invalid("candidate_window", "must be at most 1,000,000"));
        }
        if matches!(c.claim_cursor, Some(d) if d < Duration::from_millis(10)) {
            return Err(invalid("claim_cursor", "must be at least 10ms"));
        }
        if let Some(d) = c.claim_cursor {
            Error::check_max_durations([("claim_cursor", d)])?;
        }
        if let Some(flags) = &c.forbidden_flags {
            flags.check()?;
        }
        if let Listen::Channel(name) = &self.listen
            && !crate::columns::is_identifier(name)
        {
            return Err(invalid(
                "listen",
                format!("channel {name:?} is not a plain identifier of at most 63 bytes"),
            ));
        }
        if self.max_result_bytes == 0 {
            return Err(invalid("max_result_bytes", "must be at least 1"));
        }
        Ok(())
    }

    /// The options over `table`, checked together with it.
    pub(crate) fn resolve(&self, table: &JobTable) -> Result<Resolved, Error> {
        self.validate()?;
        let t = table.sql();
        if self.claim.forbidden_flags.is_some() && t.flags_column.is_none() {
            return Err(invalid(
                "forbidden_flags",
                "the table has no flags_column (JobTableOptions::flags_column)",
            ));
        }
        let listen_channel = self.listen.resolve(&t.table)?;
        // The cursor is an id: it needs claims in id order over the table. A
        // paused queue's rows are passed over without being taken, and come
        // back with no event the store sees, so those claims scan in full. (A
        // limited claim passes rows over only when a limit binds it, and such
        // a claim leaves the cursor where it was.)
        let claim_cursor = self.claim.claim_cursor.filter(|_| {
            t.view.is_none() && t.order_by.is_none() && t.pause_table.is_none() && t.aging.is_none()
        });
        // Without a cursor, a listening store still probes for jobs coming
        // due.
        let probe = claim_cursor.or(self.claim.claim_cursor.filter(|_| listen_channel.is_some()));
        let source = t.source();
        let order_by = t
            .order_by
            .clone()
            .unwrap_or_else(|| format!("{}.{}", quote(&source.alias), quote(&t.columns.id)));
        let column_expressions = if t.column_expressions.is_empty() {
            vec![format!("{}.*", quote(&source.alias))]
        } else {
            t.column_expressions.clone()
        };
        let sql = StoreParams {
            shared: t.clone(),
            column_expressions,
            order_by,
            max_num_retries: self.max_num_retries,
            retry: self.retry.clone(),
            max_num_resets: self.stall.max_num_resets,
            candidate_window: self.claim.candidate_window,
        };
        Ok(Resolved {
            name: self.name.clone(),
            label: metrics::SharedString::from(std::sync::Arc::<str>::from(self.name.as_str())),
            per_job: PerJob::new(&sql),
            sql,
            max_result_bytes: self.max_result_bytes,
            forbidden_flags: self.claim.forbidden_flags.clone(),
            stalled_max_age: self.stall.stalled_max_age,
            reset_failure_message: self.stall.reset_failure_message.clone(),
            handling: self.handling,
            claim_cursor,
            probe,
            listen_channel,
            connect_timeout: table.connect_timeout(),
        })
    }
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
