//! `DbStore`: the Postgres [`Store`](workerutil::Store). Two-phase dequeue, transaction-bound
//! handling, fenced marks, heartbeats and execution logs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Row};
use workerutil::{BoxError, Record, Wakeups, WorkerOptions};

use crate::error::{Error, Result};
use crate::table::JobTable;
use crate::{notify, schema_check, sql};
use completer::Completer;

mod come_due;
mod completer;
mod conditions;
mod cursor;
mod dequeue;
mod failed_completion;
mod flags;
mod gauges;
mod heartbeat;
mod job;
mod limited;
mod logs;
mod marks;
mod observe;
mod open;
pub(crate) mod options;
mod paused;
mod probe;
mod progress;
mod reset;
mod resolved;
mod signals;
mod transient;
mod worker_api;

pub use crate::message::MAX_FAILURE_MESSAGE_BYTES;
pub use crate::notify::{Listen, default_notify_channel};
pub use crate::retry::{Retry, RetryPolicy};
pub use conditions::DbConditions;
pub use flags::{ForbiddenFlags, ForbiddenFlagsFn};
pub use gauges::{QueueGauges, QueueStat};
pub use job::DbJob;
pub(crate) use options::ScanFn;
pub use options::{
    ClaimOptions, DEFAULT_MAX_NUM_RETRIES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESET_FAILURE_MESSAGE,
    Handling, StallOptions, StoreOptions,
};
pub use reset::ResetOutcome;
pub(crate) use reset::{ResetConfig, reset_pass};
pub(crate) use resolved::Resolved;

/// Connections a worker needs besides its handlers: one for claims and one for
/// heartbeats. Heartbeat handling needs one more, for the grouped marks.
pub const RESERVED_CONNECTIONS: u32 = 2;

/// What workers need of the pool: see [`DbStore::pool_need`].
#[derive(Debug)]
pub(crate) struct PoolNeed {
    /// Held at once by one worker.
    pub(crate) per_worker: u32,
    /// Held by the store for all its workers (the grouped-mark writer).
    pub(crate) shared: u32,
    /// Where the need comes from, for the error.
    pub(crate) reason: String,
}

/// A [`Store`](workerutil::Store) over an application's own Postgres job table.
///
/// ```no_run
/// # use dbworker::{DbStore, JobTable, JobTableOptions, StoreOptions};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// // Checks the table and every column now, naming whatever is missing.
/// let jobs = JobTable::new(&pool, JobTableOptions::new("jobs j")).await?;
/// let store = DbStore::<Job>::new(&pool, &jobs, StoreOptions::new("jobs_store")).await?;
/// # Ok(()) }
/// ```
pub struct DbStore<R> {
    pool: PgPool,
    options: Arc<Resolved>,
    scan: ScanFn<R>,
    /// Grouped marks (heartbeat handling only).
    completer: Option<Completer>,
    /// Where claims start their scan, when they can use a cursor.
    cursor: Option<Arc<cursor::ClaimCursor>>,
    /// The cursor's probe, stopped when the store is dropped or closed.
    probe: Option<probe::Probe>,
    /// Wake-ups from the listener, when `listen` is on.
    wakeups: Option<Wakeups>,
    /// The listener task, stopped when the store is dropped or closed.
    listener: Option<notify::ListenerTask>,
    /// Connections kept between transactional jobs (see `store/open.rs`).
    kept: Arc<open::Kept>,
    /// Progress reported since the last heartbeat, by job: each job's latest,
    /// with the token it was reported under (`DbJob::report_progress`).
    pending_progress: progress::Pending,
    /// Running attempts' spans no heartbeat has recorded yet (a table with
    /// traces; see `store/heartbeat.rs`).
    attempt_spans: Arc<heartbeat::Spans>,
    /// When this store last had a fair table's jobs come due tagged.
    come_due: come_due::ComeDue,
    /// The pauses its listener heard of, for jobs claimed ahead (`paused.rs`).
    pauses_heard: Arc<paused::PauseWatch>,
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

impl<R> DbStore<R>
where
    R: Record + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    /// A store over `table` (checked when it was built) whose records are
    /// read with `R`'s `sqlx::FromRow`: validates the options, then checks
    /// the configured SQL fragments (column expressions, order-by) against
    /// the table or its view and the grants a worker uses (`UPDATE` on the
    /// table, the control tables' and, with workflows, the dependency
    /// table's, a partitioned table's key table's), naming each missing one
    /// with its `GRANT`. A record read another way: [`with_scan`](Self::with_scan).
    pub async fn new(pool: &PgPool, table: &JobTable, options: StoreOptions) -> Result<Self> {
        DbStore::with_scan(pool, table, options, |row: &sqlx::postgres::PgRow| {
            R::from_row(row).map_err(|e| Box::new(e) as BoxError)
        })
        .await
    }
}

impl<R: Record> DbStore<R> {
    /// [`new`](DbStore::new) with `scan` reading each selected row (the
    /// values of the table's `column_expressions`, in order) into a record.
    pub async fn with_scan(
        pool: &PgPool,
        table: &JobTable,
        options: StoreOptions,
        scan: impl Fn(&sqlx::postgres::PgRow) -> std::result::Result<R, BoxError>
        + Send
        + Sync
        + 'static,
    ) -> Result<Self> {
        let pool = pool.clone();
        let kept = Arc::new(open::Kept::new(
            usize::try_from(pool.options().get_max_connections()).unwrap_or(usize::MAX),
        ));
        let resolved = Arc::new(options.resolve(table)?);
        schema_check::check_store(&pool, &resolved, resolved.connect_timeout).await?;
        crate::grants::Grants::worker(table.sql())
            .check(&pool)
            .await?;
        let completer = (resolved.handling == Handling::Heartbeat)
            .then(|| Completer::spawn(pool.clone(), resolved.clone()));
        // Without a cursor of their own, claims still register their
        // conditions, for the probe's look for jobs coming due.
        let positions = resolved.claim_cursor.is_some();
        let cursor = resolved
            .probe
            .map(|every| Arc::new(cursor::ClaimCursor::new(every, positions)));
        // A row another process put back (a reset, a workflow's release, an
        // operator's requeue) or inserted behind the cursor (its transaction
        // committed after a claim passed its id) takes the cursor back as
        // soon as its notification arrives, not at the probe's next look.
        let on_id = cursor
            .clone()
            .map(|c| -> notify::OnId { Arc::new(move |id| c.rewind_to(id)) });
        let pauses_heard = Arc::new(paused::PauseWatch::default());
        let heard = pauses_heard.clone();
        let told = notify::Told {
            id: on_id,
            pause: Some(Arc::new(move || heard.heard())),
        };
        if resolved.listen_channel.is_some() {
            schema_check::check_listen_url(&pool, resolved.connect_timeout).await?;
        }
        let (wakeups, listener) = match &resolved.listen_channel {
            Some(channel) => {
                let (w, guard) = notify::spawn_listener(
                    &pool,
                    channel.clone(),
                    resolved.name.clone(),
                    resolved.connect_timeout,
                    told,
                );
                (Some(w), Some(guard))
            }
            None => (None, None),
        };
        let probe = match (&cursor, resolved.probe) {
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
            scan: Arc::new(scan),
            cursor,
            probe,
            completer,
            wakeups,
            listener,
            kept,
            pending_progress: progress::Pending::default(),
            attempt_spans: Arc::default(),
            come_due: come_due::ComeDue::default(),
            pauses_heard,
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
    ///   (and one for grouped marks in heartbeat handling); too small a pool
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
                reason: "one for claims and one for heartbeats per worker, and one for the store's grouped marks".to_owned(),
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

    /// The store's stall settings: give a [`Resetter`](crate::Resetter) of
    /// the same table these (`ResetterOptions::stall`).
    pub fn stall(&self) -> StallOptions {
        StallOptions {
            stalled_max_age: self.options.stalled_max_age,
            max_num_resets: self.options.max_num_resets,
            reset_failure_message: self.options.reset_failure_message.clone(),
        }
    }

    /// The stalled max age.
    pub fn stalled_max_age(&self) -> Duration {
        self.options.stalled_max_age
    }

    /// The store's payload column (`JobTableOptions::payload_column`), if set.
    pub fn payload_column(&self) -> Option<&str> {
        self.options.payload_column.as_deref()
    }

    /// The view the store reads through, named, when it leaves out the
    /// table's queue column (claims by queue cannot name it there).
    pub(crate) fn view_lacking_queue(&self) -> Option<String> {
        let t = &self.options.sql.shared;
        let queue = t.queue_column.as_ref()?;
        let view = t.view.as_ref()?;
        t.view_lacks.contains(queue).then(|| view.display_name())
    }

    /// The table's queue column over the alias claims read (`"j"."queue"`),
    /// if it has one.
    pub(crate) fn queue_claim_column(&self) -> Option<String> {
        let t = &self.options.sql.shared;
        Some(t.read_column(t.queue_column.as_deref()?))
    }

    /// The connections kept between transactional jobs.
    pub(super) fn kept(&self) -> &Arc<open::Kept> {
        &self.kept
    }

    pub(crate) fn resolved(&self) -> &Arc<Resolved> {
        &self.options
    }

    /// Whether any job waits. Stops at the first row; cheaper than a count.
    pub async fn any_queued(&self) -> Result<bool> {
        let row = sql::any_queued(&self.options)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("any_queued"))?;
        Ok(row.get::<bool, _>(0))
    }

    /// How long the longest-waiting due job has been runnable (since it was
    /// queued or, when later, since its `process_after`: a requeue or a
    /// retry), by the database clock; a job scheduled ahead does not count.
    pub async fn max_age_in_queue(&self) -> Result<Duration> {
        let row = sql::max_age_in_queue(&self.options)
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
}
