//! `LogStore`: the second `Store`, over an append-only events table ordered by
//! a global position. A "job" is the next slice of one consumer: its
//! transaction first locks the consumer's assignment row (proof that this
//! process still owns the consumer), reads the checkpoint, and fetches the
//! events after it; completing the job advances the checkpoint in the same
//! transaction, so what the consumer wrote through that transaction and the
//! checkpoint commit together (exactly once within Postgres).

use sqlx::{PgPool, Row};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use workerutil::{
    BoxError, ExecutionLogEntry, HeartbeatResult, Lease, Store, Wakeups, WorkerOptions,
};

use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql;

use super::books::{Books, Recheck};
use super::dispatcher::LogDispatcher;
use super::options::{LogEvent, LogOptions, LogResolved};
pub use crate::consumers::slice::{EventSlice, LogJob, LogPoint};

/// The assignment table's default name.
pub const DEFAULT_ASSIGNMENT_TABLE: &str = "dbworker_consumer_assignments";
/// The checkpoint table's default name.
pub const DEFAULT_CHECKPOINT_TABLE: &str = "dbworker_consumer_checkpoints";

/// Why a [`LogStore`] stopped its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fatal {
    pub(crate) consumer: String,
    pub(crate) failures: u32,
    pub(crate) message: String,
}

/// The `Store` over an events table; see the module docs. Build it through
/// `ConsumerGroup` unless you drive a `Worker` yourself.
pub struct LogStore<E> {
    pool: PgPool,
    o: LogResolved,
    books: Books,
    /// The process's reader of the log's head, if a group attached one: then
    /// only consumers behind the head are asked about.
    dispatched: Option<(LogDispatcher, Recheck)>,
    fatal: Mutex<Option<Fatal>>,
    stop: CancellationToken,
    wakeups: Option<(Wakeups, Arc<crate::notify::ListenerTask>)>,
    _event: PhantomData<fn() -> E>,
}

impl<E> fmt::Debug for LogStore<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("name", &self.o.name)
            .field("node_id", &self.o.node_id)
            .finish_non_exhaustive()
    }
}

impl<E> LogStore<E>
where
    E: LogEvent,
{
    /// A store over `options.events_table`; checks the tables and the select
    /// list now.
    pub async fn new(pool: &PgPool, options: LogOptions) -> Result<LogStore<E>> {
        let pool = pool.clone();
        let o = options.resolve()?;
        let mut problems = Vec::new();
        for (rel, what, columns) in [
            (
                &o.assignments,
                "assignment table",
                &["consumer_name", "node_id", "updated_at"][..],
            ),
            (
                &o.checkpoints,
                "checkpoint table",
                &["consumer_name", "last_xid", "last_position", "updated_at"][..],
            ),
        ] {
            problems.extend(
                crate::schema_check::missing_columns(
                    &pool,
                    rel,
                    what,
                    columns,
                    "`dbworker migration --consumers` prints it",
                )
                .await?,
            );
        }
        let mut event_columns = vec![o.position_column.as_str(), o.transaction_column.as_str()];
        if !o.scopes.is_empty() {
            event_columns.push(&o.type_column);
        }
        problems.extend(
            crate::schema_check::missing_columns(
                &pool,
                &o.events,
                "events table",
                &event_columns,
                "",
            )
            .await?,
        );
        // Reading the log, keeping checkpoints, and locking this process's
        // assignment while a slice commits (FOR UPDATE needs UPDATE).
        problems.extend(
            Grants::new("a log consumer")
                .on("events table", &o.events, &[Privilege::Select])
                .on(
                    "checkpoint table",
                    &o.checkpoints,
                    &[Privilege::Select, Privilege::Insert, Privilege::Update],
                )
                .on(
                    "assignment table",
                    &o.assignments,
                    &[Privilege::Select, Privilege::Update],
                )
                .problems(&pool)
                .await?,
        );
        if problems.is_empty()
            && let Err(err) = sql::log_slice(&o, (i64::MAX, i64::MAX), 1)
                .execute(&pool)
                .await
        {
            problems.push(format!(
                "the column expressions are not valid against {}: {err}",
                o.events.display_name()
            ));
        }
        crate::schema_check::none(problems)?;
        let wakeups = options.listen.clone().map(|channel| {
            let (w, guard) = crate::notify::spawn_listener(
                &pool,
                channel,
                o.name.clone(),
                options.connect_timeout,
                Default::default(),
            );
            (w, Arc::new(guard))
        });
        Ok(LogStore {
            pool,
            o,
            books: Books::default(),
            dispatched: None,
            fatal: Mutex::new(None),
            stop: CancellationToken::new(),
            wakeups,
            _event: PhantomData,
        })
    }

    /// Fires when a consumer failed `max_consecutive_failures` slices in a row.
    pub(crate) fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }

    pub(crate) fn fatal(&self) -> Option<Fatal> {
        self.fatal.lock().expect("not poisoned").clone()
    }

    /// Lets `dispatcher` say when the log moved: claims then ask the
    /// database only about consumers behind its head (or due for `recheck`),
    /// and its wake-ups replace the store's own listener.
    pub(crate) fn dispatched_by(&mut self, dispatcher: LogDispatcher, recheck: Recheck) {
        self.wakeups = None;
        self.dispatched = Some((dispatcher, recheck));
    }

    /// Ends a slice in this process's books: `Ok(checkpoint)` after a commit.
    fn settle(&self, consumer: &str, outcome: std::result::Result<LogPoint, &str>) {
        let failures = self.books.settle(
            consumer,
            outcome.map_err(|_| ()),
            self.o.slice_pause,
            self.o.retry_after,
        );
        if let (Ok(at), Some((dispatcher, _))) = (outcome, &self.dispatched)
            && dispatcher.head().is_none_or(|head| at < head)
        {
            dispatcher.wake_after(self.o.slice_pause);
        }
        if let Err(message) = outcome
            && failures >= self.o.max_consecutive_failures
        {
            tracing::error!(store = %self.o.name, consumer, failures, error = message, "consumer failed too many slices in a row; stopping");
            *self.fatal.lock().expect("not poisoned") = Some(Fatal {
                consumer: consumer.to_owned(),
                failures,
                message: message.to_owned(),
            });
            self.stop.cancel();
        }
    }

    async fn rollback(job: &mut LogJob<E>) {
        if let Some(tx) = job.tx.take()
            && let Err(err) = tx.rollback().await
        {
            tracing::debug!(error = %err, "rollback failed; the connection is closed instead");
        }
    }

    async fn open_slice(&self, job: &mut LogJob<E>) -> Result<bool> {
        let consumer = job.slice.consumer.clone();
        let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
        let owned = sql::log_lock_assignment(&self.o, &consumer, &self.o.node_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("log_lock_assignment"))?;
        if owned.is_none() {
            return Ok(false);
        }
        let row = sql::log_checkpoint(&self.o, &consumer)
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("log_checkpoint"))?;
        let checkpoint = LogPoint::new(row.get("last_xid"), row.get("last_position"));
        if checkpoint.position != job.lease.token {
            return Ok(false);
        }
        let point = |r: &sqlx::postgres::PgRow| {
            LogPoint::new(
                r.get::<i64, _>(sql::LOG_XID),
                r.get::<i64, _>(sql::LOG_POSITION),
            )
        };
        let (rows, last) = match self.o.scopes.get(&consumer) {
            None => {
                let rows = sql::log_slice(&self.o, checkpoint.pair(), self.o.slice_size)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(Error::db("log_slice"))?;
                let Some(last) = rows.last().map(point) else {
                    return Ok(false);
                };
                (rows, last)
            }
            Some(types) => {
                // Read the head first: every event up to it that is in scope
                // is final and visible to the slice read after it, so the
                // checkpoint may move to the head (past the events of other
                // types) when the slice is not full.
                let row = sql::log_head(&self.o)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(Error::db("log_head"))?;
                let head = LogPoint::new(row.get(sql::LOG_HEAD_XID), row.get(sql::LOG_HEAD));
                if head <= checkpoint {
                    return Ok(false);
                }
                let rows = sql::log_scoped_slice(
                    &self.o,
                    checkpoint.pair(),
                    head.pair(),
                    types.clone(),
                    self.o.slice_size,
                )
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db("log_scoped_slice"))?;
                let full = rows.len() >= self.o.slice_size as usize;
                let last = match rows.last() {
                    Some(r) if full => point(r),
                    _ => head,
                };
                (rows, last)
            }
        };
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            match E::from_row(row) {
                Ok(e) => events.push(e),
                Err(err) => {
                    let position: i64 = row.get(sql::LOG_POSITION);
                    job.slice.problem = Some(format!(
                        "event at position {position} failed to scan: {err}"
                    ));
                    break;
                }
            }
        }
        job.slice.events = events;
        job.slice.last = last.position;
        job.slice.last_point = last;
        job.tx = Some(tx);
        Ok(true)
    }
}
impl<E> Store for LogStore<E>
where
    E: LogEvent,
{
    type Record = EventSlice<E>;
    type Job = LogJob<E>;
    type Conditions = ();

    fn check_worker_options(
        &self,
        options: &WorkerOptions,
        _claim_ahead: usize,
    ) -> std::result::Result<(), BoxError> {
        let need = options.num_handlers + 2;
        let max = self.pool.options().get_max_connections() as usize;
        if max < need {
            return Err(Box::new(Error::InvalidOption {
                field: "num_handlers",
                reason: format!(
                    "{} handlers each hold a slice transaction; the pool needs at least {need} connections (it has {max})",
                    options.num_handlers
                ),
            }));
        }
        Ok(())
    }

    /// A claimed slice holds nothing until it opens, but claiming ahead would
    /// only delay the next slice of the same consumer.
    fn default_claim_ahead(&self, _num_handlers: usize) -> usize {
        0
    }

    fn default_concurrent_dequeues(&self) -> usize {
        1
    }

    fn job_holds_resources(&self) -> bool {
        true
    }

    fn wakeups(&self) -> Option<Wakeups> {
        if let Some((dispatcher, _)) = &self.dispatched {
            return Some(dispatcher.wakeups());
        }
        self.wakeups.as_ref().map(|(w, _)| w.clone())
    }

    async fn queued_count(&self) -> std::result::Result<u64, BoxError> {
        let rows = sql::log_pending(&self.o, &self.o.node_id, self.o.consumers.clone(), None)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("log_pending"))?;
        Ok(rows.len() as u64)
    }

    async fn dequeue(
        &self,
        _hostname: &str,
        _conditions: &(),
        limit: usize,
    ) -> std::result::Result<Vec<LogJob<E>>, BoxError> {
        let ready = self.books.ready(&self.o.consumers);
        if ready.is_empty() || self.stop.is_cancelled() {
            return Ok(Vec::new());
        }
        let checkpoint =
            |r: &sqlx::postgres::PgRow| LogPoint::new(r.get("last_xid"), r.get("last_position"));
        let pending: Vec<(String, LogPoint)> = match &self.dispatched {
            None => sql::log_pending(&self.o, &self.o.node_id, ready, Some(limit))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db("log_pending"))?
                .iter()
                .map(|r| (r.get("consumer_name"), checkpoint(r)))
                .collect(),
            Some((dispatcher, recheck)) => {
                // The head is read before the consumers: one found caught up
                // has no event after its checkpoint, so none up to this head.
                let behind = self.books.behind(ready, dispatcher.head(), *recheck);
                if behind.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sql::log_held(&self.o, &self.o.node_id, behind.clone())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(Error::db("log_held"))?;
                let mut pending = Vec::new();
                for name in &behind {
                    let row = rows
                        .iter()
                        .find(|r| r.get::<String, _>("consumer_name") == *name);
                    match row {
                        None => self.books.checked(name, None),
                        Some(r) if r.get::<bool, _>("pending") => {
                            pending.push((name.clone(), checkpoint(r)));
                        }
                        Some(r) => self.books.checked(name, Some(checkpoint(r))),
                    }
                }
                pending.truncate(limit);
                pending
            }
        };
        let mut jobs = Vec::with_capacity(pending.len());
        for (consumer, after) in pending {
            let Ok(index) = self.o.consumers.binary_search(&consumer) else {
                continue;
            };
            let slot = self.books.start(&consumer);
            let index = i64::try_from(index).unwrap_or(i64::MAX);
            jobs.push(LogJob {
                slice: EventSlice {
                    consumer,
                    events: Vec::new(),
                    after: after.position,
                    last: after.position,
                    last_point: after,
                    problem: None,
                    index,
                },
                lease: Lease {
                    id: index,
                    token: after.position,
                },
                tx: None,
                _slot: slot,
            });
        }
        Ok(jobs)
    }

    async fn open(&self, job: &mut LogJob<E>) -> std::result::Result<bool, BoxError> {
        match self.open_slice(job).await {
            Ok(true) => Ok(true),
            Ok(false) => {
                // Lost the assignment, or nothing left to read: not an error.
                // Ask the database again next time rather than trust the books.
                self.books.forget(&job.slice.consumer);
                Self::rollback(job).await;
                Ok(false)
            }
            Err(err) => {
                Self::rollback(job).await;
                Err(Box::new(err))
            }
        }
    }

    /// A slice is alive while this process still holds its consumer.
    async fn heartbeat(&self, leases: &[Lease]) -> std::result::Result<HeartbeatResult, BoxError> {
        let held: Vec<String> = sql::log_assigned(&self.o, &self.o.node_id)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("log_assigned"))?
            .iter()
            .map(|r| r.get("consumer_name"))
            .collect();
        let known = leases
            .iter()
            .filter(|l| {
                usize::try_from(l.id)
                    .ok()
                    .and_then(|i| self.o.consumers.get(i))
                    .is_some_and(|name| held.contains(name))
            })
            .map(|l| l.id)
            .collect();
        Ok(HeartbeatResult {
            known,
            cancel: Vec::new(),
        })
    }

    async fn add_execution_log_entry(
        &self,
        _lease: Lease,
        _entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        Ok(None)
    }

    async fn update_execution_log_entry(
        &self,
        _lease: Lease,
        _index: usize,
        _entry: &ExecutionLogEntry,
    ) -> std::result::Result<bool, BoxError> {
        Ok(false)
    }

    async fn mark_complete(&self, job: &mut LogJob<E>) -> std::result::Result<bool, BoxError> {
        let consumer = job.slice.consumer.clone();
        let Some(mut tx) = job.tx.take() else {
            return Ok(false);
        };
        let advanced = sql::log_advance(
            &self.o,
            &consumer,
            job.lease.token,
            job.slice.last_point.pair(),
        )
        .execute(&mut *tx)
        .await
        .map_err(Error::db("log_advance"));
        let advanced = match advanced {
            Ok(done) if done.rows_affected() == 1 => true,
            Ok(_) => false,
            Err(err) => {
                self.settle(&consumer, Err(&err.to_string()));
                return Err(Box::new(err));
            }
        };
        if !advanced {
            self.books.forget(&consumer);
            let _ = tx.rollback().await;
            return Ok(false);
        }
        match tx.commit().await {
            Ok(()) => {
                self.settle(&consumer, Ok(job.slice.last_point));
                Ok(true)
            }
            Err(err) => {
                self.settle(&consumer, Err(&err.to_string()));
                Err(Box::new(Error::db("commit")(err)))
            }
        }
    }

    /// A failed slice is retried from the same position, at once: there is no
    /// retry limit or delay to override, so `retry` is not used.
    async fn mark_errored(
        &self,
        job: &mut LogJob<E>,
        message: &str,
        _retry: Option<&workerutil::Retry>,
    ) -> std::result::Result<Option<workerutil::JobState>, BoxError> {
        Self::rollback(job).await;
        tracing::warn!(store = %self.o.name, consumer = %job.slice.consumer, after = job.slice.after, error = message, "slice failed; it is retried from the same position");
        self.settle(&job.slice.consumer, Err(message));
        // Always a retry: a slice has no retry limit.
        Ok(Some(workerutil::JobState::Errored))
    }

    async fn mark_failed(
        &self,
        job: &mut LogJob<E>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        Ok(self.mark_errored(job, message, None).await?.is_some())
    }

    async fn requeue(&self, job: &mut LogJob<E>) -> std::result::Result<bool, BoxError> {
        Self::rollback(job).await;
        Ok(true)
    }

    /// A consumer cannot skip ahead in its log: a snoozed event is handed
    /// back as after a shutdown, and read again at the consumer's next poll.
    async fn mark_snoozed(
        &self,
        job: &mut LogJob<E>,
        _delay: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        Self::rollback(job).await;
        Ok(true)
    }
}
