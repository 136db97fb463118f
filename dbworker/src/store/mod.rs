//! `DbStore`: the Postgres [`Store`](workerutil::Store). Two-phase dequeue, transaction-bound
//! handling, fenced marks, heartbeats and execution logs.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use workerutil::{BoxError, Lease, Record, Wakeups, WorkerOptions, error_chain};

use crate::error::{Error, Result};
use crate::message::refused_payload;
use crate::sql::{Mark, MarkKind};
use crate::{notify, schema_check, sql};
use completer::Completer;

mod completer;
mod conditions;
mod connection_loss;
mod cursor;
mod flags;
mod gauges;
mod job;
mod job_tx;
mod limited;
pub(crate) mod options;
mod probe;
mod reset;
mod resolved;
mod worker_api;

pub use crate::message::MAX_FAILURE_MESSAGE_BYTES;
pub use crate::notify::{Listen, default_notify_channel};
pub use crate::retry::{Retry, RetryPolicy};
pub use conditions::DbConditions;
pub use flags::{ForbiddenFlags, ForbiddenFlagsFn};
pub use gauges::QueueStat;
pub use job::DbJob;
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_ERROR_HISTORY_LIMIT, DEFAULT_MAX_NUM_RETRIES,
    DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESET_FAILURE_MESSAGE, Handling, ScanFn, StoreOptions,
};
pub use reset::ResetOutcome;
pub(crate) use reset::{ResetConfig, reset_pass};
pub(crate) use resolved::Resolved;

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

/// A [`Store`](workerutil::Store) over an application's own Postgres job table.
///
/// ```no_run
/// # use dbworker::{DbStore, StoreOptions};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let options = StoreOptions::<Job>::from_row("jobs_store", "jobs j");
/// // Checks the table and every column now, naming whatever is missing.
/// let store = DbStore::new(&pool, options).await?;
/// # Ok(()) }
/// ```
pub struct DbStore<R> {
    pool: PgPool,
    options: Arc<Resolved>,
    scan: ScanFn<R>,
    /// Batched marks (heartbeat handling only).
    completer: Option<Completer>,
    /// Where claims start their scan, when they can use a cursor.
    cursor: Option<Arc<cursor::ClaimCursor>>,
    /// The cursor's probe, stopped when the store is dropped or closed.
    probe: Option<probe::Probe>,
    /// Wake-ups from the listener, when `listen` is on.
    wakeups: Option<Wakeups>,
    /// The listener task, stopped when the store is dropped or closed.
    listener: Option<notify::ListenerTask>,
    /// Connections kept between transactional jobs (see `store/job_tx.rs`).
    kept: Arc<job_tx::Kept>,
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
    pub async fn new(pool: &PgPool, options: StoreOptions<R>) -> Result<Self> {
        let pool = pool.clone();
        let kept = Arc::new(job_tx::Kept::new(
            usize::try_from(pool.options().get_max_connections()).unwrap_or(usize::MAX),
        ));
        let resolved = Arc::new(options.resolve()?);
        schema_check::check(&pool, &resolved, resolved.connect_timeout).await?;
        let completer = (resolved.handling == Handling::Heartbeat)
            .then(|| Completer::spawn(pool.clone(), resolved.clone()));
        let cursor = resolved
            .claim_cursor
            .map(|_| Arc::new(cursor::ClaimCursor::default()));
        // A row another process put back (a reset, a workflow's release, an
        // operator's requeue) or inserted behind the cursor (its transaction
        // committed after a claim passed its id) takes the cursor back as
        // soon as its notification arrives, not at the probe's next look.
        let on_id = cursor
            .clone()
            .map(|c| -> notify::OnId { Arc::new(move |id| c.rewind_to(id)) });
        let (wakeups, listener) = match &resolved.listen_channel {
            Some(channel) => {
                let (w, guard) = notify::spawn_listener(
                    &pool,
                    channel.clone(),
                    resolved.name.clone(),
                    resolved.connect_timeout,
                    on_id,
                );
                (Some(w), Some(guard))
            }
            None => (None, None),
        };
        let probe = match (&cursor, resolved.claim_cursor) {
            (Some(c), Some(every)) => Some(probe::spawn_probe(
                pool.clone(),
                resolved.clone(),
                c.clone(),
                every,
                listener.as_ref().map(notify::ListenerTask::waker),
            )),
            _ => None,
        };
        Ok(DbStore {
            pool,
            options: resolved,
            scan: options.scan,
            cursor,
            probe,
            completer,
            wakeups,
            listener,
            kept,
        })
    }

    /// Stops the store's background work and waits for it: the LISTEN
    /// connection is closed (the application's pool is left to the
    /// application). Call it before stopping the database, e.g. at the end of
    /// a test, so the server sees a clean disconnect. Dropping the store stops
    /// the same work without waiting.
    pub async fn close(&self) {
        self.kept.release_all();
        if let Some(probe) = &self.probe {
            probe.stop().await;
        }
        if let Some(listener) = &self.listener {
            listener.close().await;
        }
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
    /// [`Store::check_worker_options`](workerutil::Store::check_worker_options), so it cannot be skipped.
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
        let extra_claims =
            u32::try_from(workerutil::concurrent_dequeues(options, self).saturating_sub(1))
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
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        let out = reset_pass(&mut conn, &self.options.reset_config()).await?;
        if let Some(first) = out.reset.iter().map(|(id, _)| *id).min() {
            self.back_in_queue(first);
        }
        Ok(out)
    }

    /// Turns a phase-2 row into a job. A row that cannot become one (it fails to
    /// scan, the view hides it, the read failed) is failed here with the reason,
    /// so a bad row never stops the worker.
    async fn scan_or_fail(
        &self,
        lease: Lease,
        row: std::result::Result<Option<PgRow>, sqlx::Error>,
        tx: Option<job_tx::JobTx>,
    ) -> Result<Option<DbJob<R>>> {
        let failure = match row {
            // The scan is the user's code: a panic in it (`row.get` on a NULL)
            // fails this row with the panic message, like an error would.
            Ok(Some(row)) => match std::panic::catch_unwind(AssertUnwindSafe(|| (self.scan)(&row)))
                .unwrap_or_else(|panic| {
                    Err(format!("the scan panicked: {}", workerutil::panic_message(&panic)).into())
                }) {
                Ok(record) if record.id() == lease.id => {
                    return Ok(Some(DbJob {
                        record,
                        lease,
                        tx,
                        retry_payload: None,
                        result: None,
                        result_refused: None,
                        result_cap: self
                            .options
                            .result_column
                            .as_ref()
                            .map(|_| self.options.max_result_bytes),
                    }));
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

    /// The job `id` is going back to the queue: this store's claims look at
    /// it again (see `store/cursor.rs`).
    pub(super) fn back_in_queue(&self, id: i64) {
        if let Some(cursor) = &self.cursor {
            cursor.rewind_to(id);
        }
    }

    /// Marks a claimed job errored or failed: through the batched marks when
    /// it has no transaction (heartbeat handling), else fenced on the pool
    /// after rolling the handler's transaction back (`write_failure`).
    pub(super) async fn mark_failure(
        &self,
        job: &mut DbJob<R>,
        kind: MarkKind,
        message: &str,
        retry: Option<&Retry>,
    ) -> std::result::Result<bool, BoxError> {
        let lease = job.lease;
        let payload = job
            .retry_payload
            .take()
            .filter(|_| kind == MarkKind::Errored);
        // A payload jsonb cannot store would fail the mark and strand the job:
        // it fails instead, saying why, and keeps the payload it had.
        let refused = payload.as_ref().and_then(|p| refused_payload(message, p));
        let (kind, message, payload) = match &refused {
            Some(refused) => (MarkKind::Failed, refused.as_str(), None),
            None => (kind, message, payload),
        };
        // Taken back once the retry is written: a claim that passed the row
        // before then must not move the cursor past it (see store/cursor.rs).
        let requeued = |done: bool| {
            if done && kind == MarkKind::Errored {
                self.back_in_queue(lease.id);
            }
            done
        };
        if let Some(payload) = payload {
            return self
                .mark_errored_with_payload(job, message, retry, payload)
                .await
                .map(requeued);
        }
        if job.tx.is_none() {
            return self
                .batched(lease, kind, message, retry, None)
                .await
                .map(requeued);
        }
        let (id, token) = (job.lease.id, job.lease.token);
        let (op, statement) = match kind {
            MarkKind::Failed => (
                "mark_failed",
                sql::mark_failed(&self.options, id, token, message),
            ),
            _ => (
                "mark_errored",
                sql::mark_errored(
                    &self.options,
                    id,
                    token,
                    message,
                    &self.options.retry_rule(retry),
                ),
            ),
        };
        let done = self
            .write_failure(op, job.lease, job.tx.take(), statement)
            .await?;
        Ok(requeued(done))
    }

    /// The errored mark that also rewrites the payload (batch jobs): one fenced
    /// statement on the pool, after the handler's transaction is rolled back,
    /// in either handling mode (never batched).
    async fn mark_errored_with_payload(
        &self,
        job: &mut DbJob<R>,
        message: &str,
        retry: Option<&Retry>,
        payload: serde_json::Value,
    ) -> std::result::Result<bool, BoxError> {
        let o = &self.options;
        let (lease, rule) = (job.lease, o.retry_rule(retry));
        let statement = match &o.payload_column {
            Some(column) => sql::mark_errored_with_payload(
                o,
                lease.id,
                lease.token,
                message,
                &rule,
                column,
                payload,
            ),
            None => {
                tracing::error!(store = %o.name, record_id = lease.id, "retry_with_payload needs StoreOptions::payload_column; the payload is left as it was");
                sql::mark_errored(o, lease.id, lease.token, message, &rule)
            }
        };
        let done = self
            .write_failure("mark_errored", lease, job.tx.take(), statement)
            .await?;
        Ok(done)
    }

    /// The store's payload column ([`StoreOptions::payload_column`]), if set.
    pub fn payload_column(&self) -> Option<&str> {
        self.options.payload_column.as_deref()
    }

    /// A mark without a handler transaction: written with the next batch in
    /// heartbeat handling, else (a transactional job whose transaction is
    /// already gone) on its own.
    async fn batched(
        &self,
        lease: Lease,
        kind: MarkKind,
        message: &str,
        retry: Option<&Retry>,
        result: Option<serde_json::Value>,
    ) -> std::result::Result<bool, BoxError> {
        let rule = self.options.retry_rule(retry);
        if let Some(completer) = &self.completer {
            let mark = Mark {
                id: lease.id,
                token: lease.token,
                kind,
                message: message.to_owned(),
                result: result.map(|r| r.to_string()).unwrap_or_default(),
            };
            return Ok(completer.mark(mark, rule).await?);
        }
        let (op, statement) = match kind {
            MarkKind::Complete => ("mark_complete", self.complete_statement(lease, result)),
            MarkKind::Errored => (
                "mark_errored",
                sql::mark_errored(&self.options, lease.id, lease.token, message, &rule),
            ),
            MarkKind::Failed => (
                "mark_failed",
                sql::mark_failed(&self.options, lease.id, lease.token, message),
            ),
        };
        Ok(self.fenced_write(op, lease, None, statement).await?)
    }

    /// The completion of `lease`, with the handler's result if it set one.
    pub(super) fn complete_statement(
        &self,
        lease: Lease,
        result: Option<serde_json::Value>,
    ) -> sql::Statement {
        let o = &self.options;
        match (result, &o.result_column) {
            (Some(result), Some(column)) => {
                sql::mark_complete_with_result(o, lease.id, lease.token, column, result)
            }
            _ => o.per_job.mark_complete(lease.id, lease.token),
        }
    }

    /// Marks a claimed job failed without running it; returns whether the
    /// claim still owned it.
    async fn fail_unstarted(
        &self,
        lease: Lease,
        tx: Option<job_tx::JobTx>,
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
        tx: Option<job_tx::JobTx>,
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
