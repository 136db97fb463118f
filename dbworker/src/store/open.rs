//! The transactional open: a job's own transaction, begun when its handler
//! starts, locking its row `FOR KEY SHARE` if the claim still owns it, on a
//! connection the store keeps for the next job instead of handing it back to
//! the pool.
//!
//! sqlx tests every connection that goes back to its pool with a round trip
//! (and a task of its own) before another caller may take it. In
//! transactional handling each job begins and commits one transaction, so a
//! pooled connection per job costs that round trip per job. A connection
//! whose transaction committed cleanly is known to be healthy: the store
//! keeps it for the next job. Kept connections stay counted in the pool's
//! size, so none may wait long: a sweeper hands back to the pool every one
//! idle longer than [`KEEP_FOR`] (a busy worker reuses them within
//! milliseconds), so a quiet worker holds none, and `PgPool::close`, which
//! waits for every connection, is never held up for more than that.
//!
//! The transaction is begun and ended through sqlx's own transaction manager,
//! so a handler's nested `begin()` on `DbJob::tx()` still takes a savepoint,
//! and a transaction dropped unfinished is rolled back exactly as a dropped
//! `sqlx::Transaction` is.
//!
//! A handler whose future was dropped (its timeout, a cancellation, a
//! shutdown) or that panicked may have left a query running on the server: a
//! rollback would wait for it to finish (sqlx waits until the connection is
//! ready), minutes for a lock wait or a long sleep, with the row locked, the
//! handler slot held and no heartbeat. Such a transaction is *abandoned*: its
//! connection is detached from the pool and closed at once, so nothing it ran
//! can commit (the server rolls it back) and the pool may open a replacement;
//! then its backend (learned by the lock with its transaction's start) is
//! terminated from the pool, which ends a query still running and its locks.
//! Closing first means an abandoned job never holds a connection while it
//! waits for another (every job abandoned at once by a shutdown would starve
//! the pool), and behind a transaction pooler the server connection is
//! dropped with its client instead of waiting in the pooler's queue.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgRow, PgTransactionManager};
use sqlx::{PgConnection, PgPool, Postgres, Row};
use sqlx_core::transaction::TransactionManager;
use tokio::time::Instant;
use workerutil::{BoxError, Record};

use super::marks::is_connection_loss;
use super::{DbJob, DbStore, Handling};
use crate::error::Error;
use crate::sql;

/// How long a kept connection may wait for the next job.
pub(crate) const KEEP_FOR: Duration = Duration::from_millis(100);

/// Connections kept between transactional jobs (most recent last).
#[derive(Debug)]
pub(crate) struct Kept {
    idle: Mutex<Vec<(PoolConnection<Postgres>, Instant)>>,
    /// Whether a sweeper task is running (while any connection is kept).
    sweeping: AtomicBool,
    max: usize,
}

impl Kept {
    /// Connections kept for the next job, at most `max` (the pool's size).
    pub(crate) fn new(max: usize) -> Kept {
        Kept {
            idle: Mutex::default(),
            sweeping: AtomicBool::new(false),
            max,
        }
    }

    /// The most recently kept connection (the sweeper hands back stale ones).
    fn take(&self) -> Option<PoolConnection<Postgres>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.pop().map(|(conn, _)| conn)
    }

    /// Keeps `conn` for the next job, within the pool's size, and makes sure
    /// a sweeper will hand it back if no job takes it.
    fn put(self: &Arc<Self>, conn: PoolConnection<Postgres>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= self.max {
            return;
        }
        idle.push((conn, Instant::now()));
        if !self.sweeping.swap(true, Ordering::SeqCst) {
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }

    /// Hands every kept connection back to the pool (before it closes).
    pub(crate) fn release_all(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Hands back to the pool, every half [`KEEP_FOR`], the connections idle
/// longer than that; ends when none is left (or the store is gone).
async fn sweep(kept: Weak<Kept>) {
    loop {
        tokio::time::sleep(KEEP_FOR / 2).await;
        let Some(kept) = kept.upgrade() else { return };
        let mut idle = kept.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|(_, since)| since.elapsed() <= KEEP_FOR);
        if idle.is_empty() {
            // Under the lock: a `put` after this starts a new sweeper.
            kept.sweeping.store(false, Ordering::SeqCst);
            return;
        }
    }
}

/// An open transaction on a pool connection; derefs to the connection.
#[derive(Debug)]
pub(crate) struct JobTx {
    /// `None` once committed or rolled back.
    conn: Option<PoolConnection<Postgres>>,
    kept: Arc<Kept>,
    /// Whether the pool goes through a transaction pooler (its statements
    /// follow the pool's mode, see `sql/pooler.rs`).
    pooled: bool,
    /// Where an abandoned transaction's backend is terminated from.
    pool: PgPool,
    /// The transaction's backend and its start, once its row is locked.
    backend: Option<Backend>,
    /// The handler did not return: a query may still run on the connection.
    abandoned: bool,
}

impl JobTx {
    /// Begins a transaction on a kept connection, or on one from `pool`. A
    /// kept connection that fails to begin (the server restarted while it
    /// waited) is closed and a fresh one tried: nothing had started on it.
    pub(crate) async fn begin(pool: &PgPool, kept: &Arc<Kept>) -> Result<JobTx, sqlx::Error> {
        let pooled = sql::pool_transaction_mode(pool);
        if let Some(mut conn) = kept.take() {
            match PgTransactionManager::begin(&mut conn, None).await {
                Ok(()) => return Ok(JobTx::new(conn, pool, kept, pooled)),
                Err(err) => {
                    tracing::debug!(error = %err, "a kept connection could not begin; taking a fresh one");
                    conn.close_on_drop();
                }
            }
        }
        let mut conn = pool.acquire().await?;
        PgTransactionManager::begin(&mut conn, None).await?;
        Ok(JobTx::new(conn, pool, kept, pooled))
    }

    fn new(conn: PoolConnection<Postgres>, pool: &PgPool, kept: &Arc<Kept>, pooled: bool) -> JobTx {
        JobTx {
            conn: Some(conn),
            kept: kept.clone(),
            pooled,
            pool: pool.clone(),
            backend: None,
            abandoned: false,
        }
    }

    /// Notes the transaction's backend (the `pid` and `xact_us` columns of
    /// `lock_claimed`).
    pub(crate) fn locked_by(&mut self, row: &PgRow) -> Result<(), sqlx::Error> {
        self.backend = Some(Backend {
            pid: row.try_get("pid")?,
            xact_us: row.try_get("xact_us")?,
        });
        Ok(())
    }

    /// The handler did not return: the transaction is ended by terminating
    /// its backend, never rolled back on its connection.
    pub(crate) fn abandon(&mut self) {
        self.abandoned = true;
    }

    /// Ends the transaction without its writes: rolled back, or if
    /// abandoned, its connection closed and its backend terminated. A
    /// handler that returned may still have left a query of its own running
    /// (it dropped it on its token or its own timeout): a rollback waits for
    /// that query, so one that takes longer than [`ROLLBACK_WAIT`] is given
    /// up and the transaction ended as an abandoned one.
    pub(crate) async fn discard(mut self) -> Result<(), sqlx::Error> {
        let mut conn = self.conn.take().expect("an open transaction");
        if !self.abandoned {
            let rollback = PgTransactionManager::rollback(&mut conn);
            match tokio::time::timeout(ROLLBACK_WAIT, rollback).await {
                Ok(result) => {
                    self.finish(conn, result.is_ok());
                    return result;
                }
                Err(_) => tracing::warn!(
                    "the rollback of a job's transaction waited {ROLLBACK_WAIT:?} (a query the handler dropped still runs): ending it as abandoned"
                ),
            }
        }
        close_abandoned(&self.pool, self.backend, conn).await;
        Ok(())
    }

    /// Commits; the connection is kept for the next job if that worked.
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        let mut conn = self.conn.take().expect("an open transaction");
        let result = PgTransactionManager::commit(&mut conn).await;
        self.finish(conn, result.is_ok());
        result
    }

    /// Rolls back; the connection is kept for the next job if that worked.
    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        let mut conn = self.conn.take().expect("an open transaction");
        let result = PgTransactionManager::rollback(&mut conn).await;
        self.finish(conn, result.is_ok());
        result
    }

    /// After a clean end the connection is kept; after a failed one it is
    /// closed (its state is unknown), never handed to the next job.
    fn finish(&self, mut conn: PoolConnection<Postgres>, clean: bool) {
        if clean {
            self.kept.put(conn);
        } else {
            conn.close_on_drop();
        }
    }
}

impl Drop for JobTx {
    /// Dropped unfinished: queue the rollback, which the pool's test of the
    /// returned connection sends (as a dropped `sqlx::Transaction` does);
    /// abandoned (a lost job, no mark), close it and end its backend instead.
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.abandoned {
            let ending = close_abandoned(&self.pool, self.backend, conn);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(ending);
            }
            return;
        }
        PgTransactionManager::start_rollback(&mut conn);
    }
}

/// How long a rollback may wait for the server before the transaction is
/// ended as an abandoned one (a healthy rollback takes a round trip).
const ROLLBACK_WAIT: Duration = Duration::from_secs(2);

/// An abandoned transaction's backend: its pid and its transaction's start
/// (microseconds since the epoch), which together name it even after its
/// connection is gone and the pid could have gone to another session.
#[derive(Debug, Clone, Copy)]
struct Backend {
    pid: i32,
    xact_us: i64,
}

/// Closes `conn` at once, detached from the pool (which may open another in
/// its place), then terminates its backend from `pool` should it still be in
/// that transaction. The close happens before the returned future is polled.
fn close_abandoned(
    pool: &PgPool,
    backend: Option<Backend>,
    conn: PoolConnection<Postgres>,
) -> impl Future<Output = ()> + Send + 'static {
    // Dropping the detached connection closes its socket: the server rolls
    // the transaction back (a pooler drops its server connection too).
    drop(conn.detach());
    let pool = pool.clone();
    async move {
        // Not locked yet: no query of the handler's can be running.
        let Some(Backend { pid, xact_us }) = backend else {
            return;
        };
        let ended = sql::terminate_backend(pid, xact_us)
            .fetch_optional(&pool)
            .await
            .and_then(|row| {
                row.map(|r| Ok::<_, sqlx::Error>((r.try_get("done")?, r.try_get("untracked")?)))
                    .transpose()
            });
        match ended {
            Ok(Some((Some(true), _))) => {
                tracing::debug!(pid, "terminated an abandoned job transaction");
            }
            Ok(None) => tracing::debug!(pid, "an abandoned job transaction had ended already"),
            Ok(Some((None, false))) => {
                tracing::debug!(
                    pid,
                    "an abandoned job transaction had ended; its pid serves another"
                );
            }
            Ok(Some((None, true))) => tracing::warn!(
                pid,
                "an abandoned job transaction's backend cannot be named (track_activities is off); its query runs on until it ends (then it is rolled back)"
            ),
            Ok(Some((Some(false), _))) | Err(_) => tracing::warn!(pid, error = ?ended.err(),
                "could not terminate an abandoned job transaction's backend; its query runs on until it ends (then it is rolled back)"),
        }
    }
}

impl<'a> From<&'a mut JobTx> for sql::On<'a> {
    fn from(tx: &'a mut JobTx) -> sql::On<'a> {
        let pooled = tx.pooled;
        sql::On::Conn(DerefMut::deref_mut(tx), Some(pooled))
    }
}

impl Deref for JobTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_deref().expect("an open transaction")
    }
}

impl DerefMut for JobTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_deref_mut().expect("an open transaction")
    }
}

impl<R: Record> DbStore<R> {
    /// Transactional handling: begins the job's transaction and locks its row
    /// `FOR KEY SHARE`, if the claim still owns it. A lost connection puts the
    /// job back (counted as a reset) instead of failing it.
    pub(super) async fn open_job(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        if job.tx.is_some() {
            return Ok(true);
        }
        // Claimed ahead, then paused: back to the queue, not started.
        if self.handed_back_paused(job).await {
            let reason = "its table or queue was paused while it waited to start";
            return Err(workerutil::Error::Withheld(reason.into()).into());
        }
        if self.options.handling != Handling::Transactional {
            return Ok(true);
        }
        let lease = job.lease;
        let locked = async {
            let mut tx = JobTx::begin(&self.pool, &self.kept).await?;
            let row = self
                .options
                .per_job
                .lock_claimed(lease.id, lease.token)
                .fetch_optional(&mut tx)
                .await?;
            let Some(row) = row else { return Ok(None) };
            tx.locked_by(&row)?;
            Ok::<_, sqlx::Error>(Some(tx))
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
                self.requeue_lost(lease, "open", &err, None).await?;
                Ok(false)
            }
            Err(err) => Err(Error::db("open")(err).into()),
        }
    }
}
