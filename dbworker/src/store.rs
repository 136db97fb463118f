//! `DbStore`: the Postgres [`Store`]. Two-phase dequeue, transaction-bound
//! handling, fenced marks, heartbeats and execution logs.

use std::collections::HashMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_query::Expr;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};
use tokio_util::sync::DropGuard;
use workerutil::{
    BoxError, ExecutionLogEntry, HeartbeatResult, Job, Lease, Record, Store, Wakeups,
    WorkerOptions, error_chain,
};

use crate::completer::Completer;
use crate::connection_loss::is_connection_loss;
use crate::error::{Error, Result};
use crate::message::sanitize_log_entry;
use crate::options::{Handling, Resolved, ScanFn, StoreOptions};
use crate::resetter::ResetOutcome;
use crate::sql::{Mark, MarkKind};
use crate::{notify, schema_check, sql};

/// Connections a worker needs besides its handlers: one for claims and one for
/// heartbeats. Heartbeat handling needs one more, for the batched marks.
pub const RESERVED_CONNECTIONS: u32 = 2;

/// What workers need of the pool: see [`DbStore::pool_need`].
#[derive(Debug)]
pub(crate) struct PoolNeed {
    /// Held at once by one worker.
    pub(crate) per_worker: u32,
    /// Held by the store for all its workers (the batched-mark writer).
    pub(crate) shared: u32,
    /// Where the need comes from, for the error.
    pub(crate) reason: String,
}

/// Extra dequeue conditions returned by `pre_dequeue`: sea-query expressions
/// ANDed into the claim's `WHERE`, over the view's (or table's) alias.
///
/// ```
/// use dbworker::DbConditions;
/// use sea_query::Expr;
/// // Values are bound, never formatted into the SQL.
/// let conditions = DbConditions::new().and(Expr::cust_with_values("j.cost <= $1", [40i64]));
/// assert_eq!(conditions.len(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct DbConditions(Vec<Expr>);

impl DbConditions {
    /// No extra condition.
    pub fn new() -> Self {
        DbConditions(Vec::new())
    }

    /// Adds a condition.
    pub fn and(mut self, condition: Expr) -> Self {
        self.0.push(condition);
        self
    }

    /// Adds `column = ANY(values)`, with `column` written as `alias.column` over
    /// the view's (or table's) alias (each part is quoted; the values are bound).
    /// For a [`KindRegistry`](workerutil::KindRegistry) that claims only its kinds:
    ///
    /// ```
    /// use dbworker::DbConditions;
    /// let only = DbConditions::new().column_in("j.kind", &["email".to_owned()]);
    /// assert_eq!(only.len(), 1);
    /// ```
    pub fn column_in(self, column: &str, values: &[String]) -> Self {
        let column: Vec<String> = column.split('.').map(crate::sql::quote).collect();
        self.and(Expr::cust_with_values(
            format!("{} = ANY($1)", column.join(".")),
            [sea_query::Value::from(values.to_vec())],
        ))
    }

    /// How many conditions there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A job dequeued from a [`DbStore`]: the record and, in transactional
/// handling, the transaction that locks its row.
pub struct DbJob<R> {
    record: R,
    lease: Lease,
    tx: Option<Transaction<'static, Postgres>>,
}

impl<R: fmt::Debug> fmt::Debug for DbJob<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbJob")
            .field("record", &self.record)
            .field("lease", &self.lease)
            .field("transactional", &self.tx.is_some())
            .finish()
    }
}

impl<R> DbJob<R> {
    /// The record.
    pub fn record(&self) -> &R {
        &self.record
    }

    /// The connection of the transaction that locks this job's row (transactional
    /// handling only). What the handler writes here commits together with the
    /// job's completion, and is rolled back if the job does not complete.
    ///
    /// The transaction is `READ COMMITTED`; keep it so (a stricter level would make
    /// the final mark fail on the concurrent heartbeat updates).
    pub fn tx(&mut self) -> Option<&mut PgConnection> {
        self.tx.as_deref_mut()
    }
}

impl<R: Record> Job for DbJob<R> {
    type Record = R;

    fn record(&self) -> &R {
        &self.record
    }

    fn lease(&self) -> Lease {
        self.lease
    }
}

/// A [`Store`] over an application's own Postgres job table.
///
/// ```no_run
/// # use dbworker::{DbStore, StoreOptions};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let options = StoreOptions::<Job>::from_row("jobs_store", "jobs j");
/// // Checks the table and every column now, naming whatever is missing.
/// let store = DbStore::new(pool, options).await?;
/// # Ok(()) }
/// ```
pub struct DbStore<R> {
    pool: PgPool,
    options: Arc<Resolved>,
    scan: ScanFn<R>,
    /// Batched marks (heartbeat handling only).
    completer: Option<Completer>,
    /// Wake-ups from the listener, when `listen` is on.
    wakeups: Option<Wakeups>,
    /// Stops the listener task when the store is dropped.
    _listener: Option<DropGuard>,
}

impl<R> fmt::Debug for DbStore<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbStore")
            .field("name", &self.options.name)
            .field("table", &self.options.table)
            .field("view", &self.options.view)
            .field("handling", &self.options.handling)
            .finish_non_exhaustive()
    }
}

impl<R: Record> DbStore<R> {
    /// Validates the options, then checks the table, the view and every column
    /// (after renaming) and every configured SQL fragment against the database.
    /// All problems are reported together in one [`Error::Schema`].
    pub async fn new(pool: PgPool, options: StoreOptions<R>) -> Result<Self> {
        let resolved = Arc::new(options.resolve()?);
        schema_check::check(&pool, &resolved).await?;
        let completer = (resolved.handling == Handling::Heartbeat)
            .then(|| Completer::spawn(pool.clone(), resolved.clone()));
        let (wakeups, listener) = match &resolved.listen_channel {
            Some(channel) => {
                let (w, guard) = notify::spawn_listener(
                    &pool,
                    channel.clone(),
                    resolved.name.clone(),
                    resolved.connect_timeout,
                );
                (Some(w), Some(guard))
            }
            None => (None, None),
        };
        Ok(DbStore {
            pool,
            options: resolved,
            scan: options.scan,
            completer,
            wakeups,
            _listener: listener,
        })
    }

    /// Checks that a worker with `options`, claiming `claim_ahead` jobs beyond
    /// its free handlers, fits this store:
    ///
    /// - the pool serves every connection the worker holds at once: in
    ///   transactional handling one per running job (claimed-ahead jobs hold
    ///   none until they start), plus one for
    ///   claims, one more per further concurrent claim, and one for heartbeats
    ///   (and one for batched marks in heartbeat handling); too small a pool
    ///   deadlocks;
    /// - heartbeats come at least twice per stalled max age, or the resetter
    ///   would requeue live jobs;
    /// - a worker gives up its jobs (`heartbeat_failure_limit`, plus three
    ///   heartbeat intervals for the round trips in flight) before the resetter
    ///   may hand them to someone else (`stalled_max_age`).
    ///
    /// [`Worker::new`](workerutil::Worker::new) runs it through
    /// [`Store::check_worker_options`], so it cannot be skipped.
    pub fn check_worker(&self, options: &WorkerOptions, claim_ahead: usize) -> Result<()> {
        let stalled = self.stalled_max_age();
        let beat = options.heartbeat_interval;
        if beat * 2 > stalled {
            return Err(Error::InvalidOption {
                field: "heartbeat_interval",
                reason: format!(
                    "{beat:?} is more than half the store's stalled_max_age ({stalled:?}); live jobs would be reset"
                ),
            });
        }
        match options.heartbeat_failure_limit {
            Some(limit) if limit + beat * 3 < stalled => {}
            other => {
                return Err(Error::InvalidOption {
                    field: "heartbeat_failure_limit",
                    reason: format!(
                        "{other:?} must be set, and with three heartbeat intervals ({beat:?} each) stay below the store's stalled_max_age ({stalled:?}), so a worker that cannot heartbeat stops its jobs before they are reset"
                    ),
                });
            }
        }
        // Claimed-ahead jobs hold nothing (a job's transaction opens when it
        // starts), so `claim_ahead` does not count.
        let _ = claim_ahead;
        let need = self.pool_need(options);
        self.check_pool(need.per_worker.saturating_add(need.shared), need.reason)
    }

    /// The connections a worker with `options` holds at once on this store,
    /// and those the store shares between all its workers.
    pub(crate) fn pool_need(&self, options: &WorkerOptions) -> PoolNeed {
        let handlers = u32::try_from(options.num_handlers).unwrap_or(u32::MAX);
        // Claims beyond the first each need a connection of their own.
        let extra_claims = u32::try_from(options.concurrent_dequeues_for(self).saturating_sub(1))
            .unwrap_or(u32::MAX);
        match self.handling() {
            Handling::Transactional => PoolNeed {
                per_worker: handlers
                    .saturating_add(RESERVED_CONNECTIONS)
                    .saturating_add(extra_claims),
                shared: 0,
                reason: format!(
                    "transactional handling holds one per running job: {handlers} handlers + {RESERVED_CONNECTIONS} for claims and heartbeats + {extra_claims} for further concurrent claims, per worker"
                ),
            },
            Handling::Heartbeat => PoolNeed {
                per_worker: RESERVED_CONNECTIONS,
                shared: 1,
                reason: "one for claims and one for heartbeats per worker, and one for the store's batched marks".to_owned(),
            },
        }
    }

    /// Refuses a pool smaller than `needed`.
    pub(crate) fn check_pool(&self, needed: u32, reason: String) -> Result<()> {
        let max = self.pool.options().get_max_connections();
        if max < needed {
            return Err(Error::PoolTooSmall {
                max_connections: max,
                needed,
                reason,
            });
        }
        Ok(())
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// The handling mode.
    pub fn handling(&self) -> Handling {
        self.options.handling
    }

    /// The stalled max age.
    pub fn stalled_max_age(&self) -> Duration {
        self.options.stalled_max_age
    }

    pub(crate) fn resolved(&self) -> &Arc<Resolved> {
        &self.options
    }

    /// Whether any job waits. Stops at the first row; cheaper than a count.
    pub async fn any_queued(&self) -> Result<bool> {
        let row = sql::any_queued(&self.options)
            .query()
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("any_queued"))?;
        Ok(row.get::<bool, _>(0))
    }

    /// How long the oldest waiting job has waited, by the database clock.
    pub async fn max_age_in_queue(&self) -> Result<Duration> {
        let row = sql::max_age_in_queue(&self.options)
            .query()
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("max_age_in_queue"))?;
        Ok(Duration::from_secs_f64(row.get::<f64, _>(0).max(0.0)))
    }

    /// Runs one resetter pass over this store's table (see [`crate::Resetter`]).
    pub async fn reset_stalled(&self) -> Result<ResetOutcome> {
        crate::resetter::reset_pass(&self.pool, &self.options.reset_config()).await
    }

    /// Turns a phase-2 row into a job. A row that cannot become one (it fails to
    /// scan, the view hides it, the read failed) is failed here with the reason,
    /// so a bad row never stops the worker.
    async fn scan_or_fail(
        &self,
        lease: Lease,
        row: std::result::Result<Option<PgRow>, sqlx::Error>,
        tx: Option<Transaction<'static, Postgres>>,
    ) -> Result<Option<DbJob<R>>> {
        let failure = match row {
            // The scan is the user's code: a panic in it (`row.get` on a NULL)
            // fails this row with the panic message, like an error would.
            Ok(Some(row)) => match std::panic::catch_unwind(AssertUnwindSafe(|| (self.scan)(&row)))
                .unwrap_or_else(|panic| {
                    Err(format!("the scan panicked: {}", workerutil::panic_message(&panic)).into())
                }) {
                Ok(record) if record.id() == lease.id => {
                    return Ok(Some(DbJob { record, lease, tx }));
                }
                Ok(record) => format!(
                    "failed to scan record {}: the scanned record has id {}",
                    lease.id,
                    record.id()
                ),
                Err(err) => format!(
                    "failed to scan record {}: {}",
                    lease.id,
                    error_chain(err.as_ref())
                ),
            },
            Ok(None) => format!(
                "record {} is not visible through {}",
                lease.id,
                self.options.source().display_name()
            ),
            Err(err) => format!("failed to read record {}: {}", lease.id, error_chain(&err)),
        };
        let marked = self.fail_unstarted(lease, tx, &failure).await?;
        if marked {
            tracing::error!(store = %self.options.name, record_id = lease.id, reason = %failure, "marked the job failed");
        } else {
            // The fenced mark found it reset between the two phases: not ours any more.
            tracing::warn!(store = %self.options.name, record_id = lease.id, "claimed row was reset before it could be opened");
        }
        Ok(None)
    }

    /// A mark without a handler transaction: written with the next batch in
    /// heartbeat handling, else (a transactional job whose transaction is
    /// already gone) on its own.
    async fn batched(
        &self,
        lease: Lease,
        kind: MarkKind,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        if let Some(completer) = &self.completer {
            let mark = Mark {
                id: lease.id,
                token: lease.token,
                kind,
                message: message.to_owned(),
            };
            return Ok(completer.mark(mark).await?);
        }
        let (op, statement) = match kind {
            MarkKind::Complete => (
                "mark_complete",
                sql::mark_complete(&self.options, lease.id, lease.token),
            ),
            MarkKind::Errored => (
                "mark_errored",
                sql::mark_errored(&self.options, lease.id, lease.token, message),
            ),
            MarkKind::Failed => (
                "mark_failed",
                sql::mark_failed(&self.options, lease.id, lease.token, message),
            ),
        };
        Ok(self.fenced_write(op, lease, None, statement).await?)
    }

    /// Marks a claimed job failed without running it; returns whether the
    /// claim still owned it.
    async fn fail_unstarted(
        &self,
        lease: Lease,
        tx: Option<Transaction<'static, Postgres>>,
        message: &str,
    ) -> Result<bool> {
        let statement = sql::mark_failed(&self.options, lease.id, lease.token, message);
        self.write_failure("mark_failed", lease, tx, statement)
            .await
    }

    /// Runs a fenced statement on the pool, after rolling back the handler's
    /// transaction (a failure is recorded outside it, without its writes).
    pub(crate) async fn fenced_write(
        &self,
        op: &'static str,
        lease: Lease,
        tx: Option<Transaction<'static, Postgres>>,
        statement: sql::Statement,
    ) -> Result<bool> {
        if let Some(tx) = tx
            && let Err(err) = tx.rollback().await
        {
            tracing::warn!(record_id = lease.id, error = %err, "rollback of the handler's transaction failed");
        }
        let done = statement
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db(op))?;
        Ok(done.rows_affected() == 1)
    }

    /// An append matched no row: the lease was lost (`None`), or this attempt's
    /// log is full (an error the handler sees).
    async fn log_refused(&self, lease: Lease) -> std::result::Result<Option<usize>, BoxError> {
        let owned = sql::log_len(&self.options, lease.id, lease.token)
            .query()
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("log_len"))?;
        let limit = workerutil::MAX_EXECUTION_LOG_ENTRIES;
        match owned.map(|r| r.get::<i64, _>("len")) {
            Some(len) if usize::try_from(len).unwrap_or(0) >= limit => {
                Err(workerutil::Error::ExecutionLogFull {
                    id: lease.id,
                    limit,
                }
                .into())
            }
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl<R: Record> Store for DbStore<R> {
    type Record = R;
    type Job = DbJob<R>;
    type Conditions = DbConditions;

    fn check_worker_options(
        &self,
        options: &WorkerOptions,
        claim_ahead: usize,
    ) -> std::result::Result<(), BoxError> {
        Ok(self.check_worker(options, claim_ahead)?)
    }

    /// A handler count ahead, in both modes: a buffered job holds no
    /// connection (transactional handling opens its transaction when it starts).
    fn default_claim_ahead(&self, num_handlers: usize) -> usize {
        num_handlers
    }

    /// Heartbeat handling keeps two claims in flight while the queue is busy;
    /// transactional handling one, since each claim in flight needs a
    /// connection beside those its jobs hold.
    fn default_concurrent_dequeues(&self) -> usize {
        match self.options.handling {
            Handling::Heartbeat => 2,
            Handling::Transactional => 1,
        }
    }

    fn wakeups(&self) -> Option<Wakeups> {
        self.wakeups.clone()
    }

    /// In transactional handling a job holds its transaction's connection
    /// until the mark commits; the pool is sized for one per handler.
    fn job_holds_resources(&self) -> bool {
        self.options.handling == Handling::Transactional
    }

    async fn queued_count(&self) -> std::result::Result<u64, BoxError> {
        let row = sql::queued_count(&self.options)
            .query()
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("queued_count"))?;
        Ok(u64::try_from(row.get::<i64, _>(0)).unwrap_or(0))
    }

    async fn dequeue(
        &self,
        hostname: &str,
        conditions: &DbConditions,
        limit: usize,
    ) -> std::result::Result<Vec<DbJob<R>>, BoxError> {
        let o = &self.options;
        // The claim reads the records itself, unless a view must be read after
        // the table's rows are claimed. Transactional handling locks each row
        // later, in the job's own task (`open`), so claims never wait for that.
        let with_record = o.view.is_none();
        let started = std::time::Instant::now();
        let claim = sql::claim(o, hostname, &conditions.0, limit.max(1), with_record);
        let rows = if o.limit_table.is_some() {
            // Limited claims of this table run one at a time, each seeing the
            // jobs the ones before it claimed, so no queue exceeds its limit.
            let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
            sql::claim_lock(o)
                .query()
                .execute(&mut *tx)
                .await
                .map_err(Error::db("claim_lock"))?;
            let rows = claim
                .query()
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db("claim"))?;
            tx.commit().await.map_err(Error::db("commit"))?;
            rows
        } else {
            claim
                .query()
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db("claim"))?
        };
        tracing::debug!(store = %o.name, limit, claimed = rows.len(), took = ?started.elapsed(), "claimed");
        let mut leases = Vec::with_capacity(rows.len());
        let mut opened: Vec<Result<Option<DbJob<R>>>> = Vec::with_capacity(rows.len());
        let mut claimed_rows = Vec::new();
        for row in rows {
            let lease = Lease {
                id: row.get(sql::RECORD_ID),
                token: row.get(sql::CLAIMED_TOKEN),
            };
            if row
                .get::<Option<bool>, _>(sql::CLAIMED_CANCEL)
                .unwrap_or(false)
            {
                // Canceled while it waited: record that instead of running it.
                let canceled = self
                    .fail_unstarted(lease, None, "job was canceled before it started")
                    .await;
                opened.push(canceled.map(|_| None));
            } else if with_record {
                claimed_rows.push((lease, row));
            } else {
                leases.push(lease);
            }
        }
        for (lease, row) in claimed_rows {
            opened.push(self.scan_or_fail(lease, Ok(Some(row)), None).await);
        }
        // One read for the whole batch, through the view.
        if !leases.is_empty() {
            let ids = leases.iter().map(|l| l.id).collect();
            match sql::select_records(o, ids)
                .query()
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => {
                    let mut by_id: HashMap<i64, PgRow> = rows
                        .into_iter()
                        .map(|r| (r.get::<i64, _>(sql::RECORD_ID), r))
                        .collect();
                    for lease in leases {
                        let row = Ok(by_id.remove(&lease.id));
                        opened.push(self.scan_or_fail(lease, row, None).await);
                    }
                }
                // Left processing: the resetter requeues them.
                Err(err) => opened.push(Err(Error::db("select_records")(err))),
            }
        }
        let mut jobs = Vec::with_capacity(opened.len());
        let mut first_error = None;
        // One bad row must not strand the others this call claimed.
        for result in opened {
            match result {
                Ok(Some(job)) => jobs.push(job),
                Ok(None) => {}
                Err(err) => {
                    tracing::error!(error = %err, "could not open a claimed job; the resetter will requeue it");
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) if jobs.is_empty() => Err(err.into()),
            _ => Ok(jobs),
        }
    }

    /// Transactional handling: begins the job's transaction and locks its row
    /// `FOR KEY SHARE`, if the claim still owns it. A lost connection puts the
    /// job back (counted as a reset) instead of failing it.
    async fn open(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        if self.options.handling != Handling::Transactional || job.tx.is_some() {
            return Ok(true);
        }
        let lease = job.lease;
        let locked = async {
            let mut tx = self.pool.begin().await?;
            let row = sql::lock_claimed(&self.options, lease.id, lease.token)
                .query()
                .fetch_optional(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(row.map(|_| tx))
        };
        match locked.await {
            Ok(Some(tx)) => {
                job.tx = Some(tx);
                Ok(true)
            }
            Ok(None) => {
                tracing::warn!(store = %self.options.name, record_id = lease.id, "claimed row was reset before it could be locked; not running it");
                Ok(false)
            }
            Err(err) if is_connection_loss(&err) => {
                self.requeue_lost(lease, "open", &err).await?;
                Ok(false)
            }
            Err(err) => Err(Error::db("open")(err).into()),
        }
    }

    async fn heartbeat(&self, leases: &[Lease]) -> std::result::Result<HeartbeatResult, BoxError> {
        let ids = leases.iter().map(|l| l.id).collect();
        let tokens = leases.iter().map(|l| l.token).collect();
        let rows = sql::heartbeat(&self.options, ids, tokens)
            .query()
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("heartbeat"))?;
        let mut result = HeartbeatResult::default();
        for row in rows {
            let id: i64 = row.get("id");
            result.known.push(id);
            if row.get::<Option<bool>, _>("cancel").unwrap_or(false) {
                result.cancel.push(id);
            }
        }
        Ok(result)
    }

    async fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let row = sql::log_append(&self.options, lease.id, lease.token, json)
            .query()
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("log_append"))?;
        match row {
            Some(r) => Ok(Some(
                usize::try_from(r.get::<i64, _>("len")).unwrap_or(1) - 1,
            )),
            None => self.log_refused(lease).await,
        }
    }

    async fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<bool, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let done = sql::log_update(&self.options, lease.id, lease.token, index, json)
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db("log_update"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn mark_complete(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        let Some(mut tx) = job.tx.take() else {
            return self.batched(job.lease, MarkKind::Complete, "").await;
        };
        let statement = sql::mark_complete(&self.options, job.lease.id, job.lease.token);
        // The mark and the handler's writes commit together, or not at all.
        let done = match statement.query().execute(&mut *tx).await {
            Ok(done) => done,
            Err(err) => {
                return Err(self
                    .completion_failed("mark_complete", job.lease, err)
                    .await
                    .into());
            }
        };
        if done.rows_affected() != 1 {
            // No longer ours: the handler's writes must not land either.
            tx.rollback().await.map_err(Error::db("rollback"))?;
            return Ok(false);
        }
        if let Err(err) = tx.commit().await {
            return Err(self
                .completion_failed("commit", job.lease, err)
                .await
                .into());
        }
        Ok(true)
    }

    async fn mark_errored(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        if job.tx.is_none() {
            return self.batched(job.lease, MarkKind::Errored, message).await;
        }
        let statement = sql::mark_errored(&self.options, job.lease.id, job.lease.token, message);
        Ok(self
            .write_failure("mark_errored", job.lease, job.tx.take(), statement)
            .await?)
    }

    async fn mark_failed(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        if job.tx.is_none() {
            return self.batched(job.lease, MarkKind::Failed, message).await;
        }
        let statement = sql::mark_failed(&self.options, job.lease.id, job.lease.token, message);
        Ok(self
            .write_failure("mark_failed", job.lease, job.tx.take(), statement)
            .await?)
    }

    async fn requeue(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        let statement = sql::requeue(&self.options, job.lease.id, job.lease.token);
        Ok(self
            .fenced_write("requeue", job.lease, job.tx.take(), statement)
            .await?)
    }
}
