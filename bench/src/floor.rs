//! The raw-SQL floors: the same claim and completion without the framework.
//!
//! - heartbeat handling: each of `connections` tasks, on its own connection,
//!   claims `batch` rows in one statement and completes them in one;
//! - transactional handling: one connection claims as many rows as there are
//!   free slots (up to `batch`), and `handlers` tasks, each on its own
//!   connection, finish each job in its own transaction: BEGIN, lock the row
//!   `FOR KEY SHARE`, mark it completed, COMMIT.
//!
//! `BENCH_FLOOR=one-write` turns the heartbeat floor into a diagnostic of a
//! shape dbworker does not have: each batch is locked (`FOR UPDATE SKIP
//! LOCKED`, no write) and completed in one transaction, so each row is
//! written once, where a claim and its completion write it twice.
//! `BENCH_FLOOR=lock-delete` does the same but deletes the finished rows.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::db::{Bench, TABLE};
use crate::framework::Progress;
use crate::report::Run;
use crate::{RUN_TIMEOUT, Result};

/// Locks up to `$1` eligible rows in id order and returns their ids. On the
/// HOT layout (`BENCH_TABLE_LAYOUT=hot`) it names the live column, as
/// dbworker's claim does, so it reads the layout's index.
fn eligible_sql() -> String {
    let live = if std::env::var("BENCH_TABLE_LAYOUT").as_deref() == Ok("hot") {
        "AND dbworker_live "
    } else {
        ""
    };
    format!(
        "SELECT id FROM {TABLE} \
         WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) {live}\
         ORDER BY id FOR UPDATE SKIP LOCKED LIMIT $1"
    )
}

/// Claims up to `$1` eligible rows; returns their ids.
fn claim_sql() -> String {
    format!(
        "UPDATE {TABLE} SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'floor' \
         WHERE id IN ({}) RETURNING id",
        eligible_sql()
    )
}

/// The heartbeat floor's shape (`BENCH_FLOOR`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Unset: claim, then complete, each a transaction of its own.
    ClaimThenComplete,
    /// `one-write`: lock, then complete, in one transaction.
    LockThenComplete,
    /// `lock-delete`: lock, then delete, in one transaction.
    LockThenDelete,
}

impl Shape {
    fn from_env() -> Result<Shape> {
        match std::env::var("BENCH_FLOOR").as_deref() {
            Err(_) | Ok("") => Ok(Shape::ClaimThenComplete),
            Ok("one-write") => Ok(Shape::LockThenComplete),
            Ok("lock-delete") => Ok(Shape::LockThenDelete),
            Ok(other) => {
                Err(format!("BENCH_FLOOR={other}: expected one-write or lock-delete").into())
            }
        }
    }
}

async fn claim(conn: &mut PgConnection, limit: usize) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(AssertSqlSafe(claim_sql()))
        .bind(i64::try_from(limit)?)
        .fetch_all(conn)
        .await?)
}

/// Completes the claimed `ids` in one statement and counts them.
async fn complete(conn: &mut PgConnection, ids: Vec<i64>, progress: &Progress) -> Result<()> {
    let n = u64::try_from(ids.len())?;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {TABLE} SET state = 'completed', finished_at = now() \
         WHERE id = ANY($1) AND state = 'processing'"
    )))
    .bind(ids)
    .execute(conn)
    .await?;
    progress.add(n);
    Ok(())
}

/// Opens `n` connections (before the clock starts).
async fn connect(bench: &Bench, n: usize) -> Result<Vec<PgConnection>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(PgConnection::connect(bench.url()).await?);
    }
    Ok(conns)
}

/// Runs `tasks` to the end under the run timeout, sampling `progress`, and
/// checks that every job finished (completed, or gone when `deletes`).
async fn finish(
    bench: &Bench,
    progress: &Arc<Progress>,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
    jobs: u64,
    connections: u32,
    deletes: bool,
) -> Result<Run> {
    let stop = CancellationToken::new();
    let sampler = progress.sample(stop.clone());
    let all = async {
        for task in tasks {
            task.await??;
        }
        Result::Ok(())
    };
    tokio::time::timeout(RUN_TIMEOUT, all).await??;
    stop.cancel();
    let per_second = sampler.await?;
    let statements = bench.statements().await?;
    let completed = if deletes {
        jobs.saturating_sub(bench.unfinished().await?)
    } else {
        bench.completed().await?
    };
    if completed != jobs {
        return Err(format!("floor completed {completed} of {jobs} jobs").into());
    }
    Ok(Run {
        jobs,
        elapsed: progress.elapsed(),
        per_second,
        statements,
        connections,
    })
}

/// Heartbeat floor: claim `batch`, complete `batch`, on `connections` connections.
pub(crate) async fn heartbeat(
    bench: &Bench,
    connections: usize,
    batch: usize,
    jobs: u64,
) -> Result<Run> {
    let conns = connect(bench, connections).await?;
    bench.reset_statements().await?;
    let shape = Shape::from_env()?;
    let progress = Progress::new();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if shape != Shape::ClaimThenComplete {
                    let delete = shape == Shape::LockThenDelete;
                    if !lock_and_complete(&mut conn, batch, delete, &progress).await? {
                        return Ok(());
                    }
                    continue;
                }
                let ids = claim(&mut conn, batch).await?;
                if ids.is_empty() {
                    return Ok(());
                }
                complete(&mut conn, ids, &progress).await?;
            }
        }));
    }
    let connections = u32::try_from(connections)?;
    let deletes = shape == Shape::LockThenDelete;
    finish(bench, &progress, tasks, jobs, connections, deletes).await
}

/// `BENCH_FLOOR=one-write` (or `lock-delete`): one transaction locks up to
/// `limit` eligible rows and completes (or deletes) them, writing each once.
/// False once none is left.
async fn lock_and_complete(
    conn: &mut PgConnection,
    limit: usize,
    delete: bool,
    progress: &Progress,
) -> Result<bool> {
    let mut tx = conn.begin().await?;
    let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(eligible_sql()))
        .bind(i64::try_from(limit)?)
        .fetch_all(&mut *tx)
        .await?;
    if ids.is_empty() {
        return Ok(false);
    }
    let n = u64::try_from(ids.len())?;
    let finish = if delete {
        format!("DELETE FROM {TABLE} WHERE id = ANY($1)")
    } else {
        format!(
            "UPDATE {TABLE} SET state = 'completed', started_at = now(), finished_at = now(), \
             worker_hostname = 'floor' WHERE id = ANY($1)"
        )
    };
    sqlx::query(AssertSqlSafe(finish))
        .bind(ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    progress.add(n);
    Ok(true)
}

/// The heartbeat floor taking jobs as they come: `connections` tasks claim
/// up to `batch` rows, note each claimed id's start in `starts`, complete
/// them, and poll again after 10 ms when a claim finds nothing.
pub(crate) struct Polling {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
}

/// Starts [`Polling`].
pub(crate) async fn poll(
    bench: &Bench,
    connections: usize,
    batch: usize,
    progress: Arc<Progress>,
    starts: crate::framework::Starts,
) -> Result<Polling> {
    let conns = connect(bench, connections).await?;
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (progress, starts, stop) = (progress.clone(), starts.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let ids = claim(&mut conn, batch).await?;
                if ids.is_empty() {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
                let now = std::time::Instant::now();
                {
                    let mut starts = crate::latency::lock(&starts);
                    for id in &ids {
                        starts.insert(*id, now);
                    }
                }
                complete(&mut conn, ids, &progress).await?;
            }
            Ok(())
        }));
    }
    Ok(Polling { stop, tasks })
}

impl Polling {
    /// Stops the tasks once their current claim is completed.
    pub(crate) async fn stop(self) -> Result<()> {
        self.stop.cancel();
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// Transactional floor: batch claims into free slots, one transaction per job,
/// `handlers` jobs at once.
pub(crate) async fn transactional(
    bench: &Bench,
    handlers: usize,
    batch: usize,
    jobs: u64,
) -> Result<Run> {
    let mut conns = connect(bench, handlers + 1).await?;
    let mut claimer = conns.pop().ok_or("no connection")?;
    bench.reset_statements().await?;
    let lock =
        format!("SELECT id FROM {TABLE} WHERE id = $1 AND state = 'processing' FOR KEY SHARE");
    let mark = format!(
        "UPDATE {TABLE} SET state = 'completed', finished_at = clock_timestamp() \
         WHERE id = $1 AND state = 'processing'"
    );
    let progress = Progress::new();
    let slots = Arc::new(Semaphore::new(handlers));
    let (send, receive) = mpsc::unbounded_channel::<(i64, OwnedSemaphorePermit)>();
    let receive = Arc::new(Mutex::new(receive));

    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(async move {
        loop {
            // Wait for one free slot, then take every other free one too.
            let mut permits = vec![slots.clone().acquire_owned().await?];
            while permits.len() < batch {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let ids = claim(&mut claimer, permits.len()).await?;
            if ids.is_empty() {
                // Dropping the sender ends the handlers once they drain.
                return Ok(());
            }
            for (id, permit) in ids.into_iter().zip(permits) {
                send.send((id, permit))?;
            }
        }
    }));
    for mut conn in conns {
        let (progress, receive) = (progress.clone(), receive.clone());
        let (lock, mark) = (lock.clone(), mark.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let next = receive.lock().await.recv().await;
                let Some((id, _slot)) = next else {
                    return Ok(());
                };
                let mut tx = conn.begin().await?;
                sqlx::query(AssertSqlSafe(lock.clone()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or("claimed row vanished")?;
                sqlx::query(AssertSqlSafe(mark.clone()))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                progress.add(1);
            }
        }));
    }
    let connections = u32::try_from(handlers + 1)?;
    finish(bench, &progress, tasks, jobs, connections, false).await
}
