//! Jobs claimed ahead meeting a pause, shared by the tests that pause a
//! queue while a worker's only handler is busy and its buffer holds the
//! rest (`#[path]`): the gate that holds the first job, the worker's
//! options, and the check of what became of the buffered jobs.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbworker::DbStore;
use tokio::sync::{Notify, broadcast};
use workerutil::{Outcome, Record, Store, WorkerEvent, WorkerOptions};

use crate::common::{Db, Job};

/// The jobs a test enqueues: one to hold the handler, four to wait behind it.
pub const JOBS: usize = 5;

/// Holds the first job it starts until opened; records every job started.
#[derive(Default)]
pub struct Gate {
    open: Notify,
    started: Mutex<Vec<i64>>,
}

impl Gate {
    /// Records `id` as started; the first one waits until [`open`](Self::open).
    pub async fn start(&self, id: i64) {
        let first = {
            let mut started = self.started.lock().unwrap();
            started.push(id);
            started.len() == 1
        };
        if first {
            self.open.notified().await;
        }
    }

    /// Lets the held job finish (a permit if it has not reached the gate yet).
    pub fn open(&self) {
        self.open.notify_one();
    }

    pub fn started(&self) -> Vec<i64> {
        self.started.lock().unwrap().clone()
    }
}

/// A handler of the tests' records that passes through the gate.
#[derive(Default, Clone)]
pub struct Gated(pub Arc<Gate>);

impl workerutil::Handler<DbStore<Job>> for Gated {
    async fn handle(
        &self,
        job: &mut dbworker::DbJob<Job>,
        _ctx: &workerutil::JobContext<DbStore<Job>>,
    ) -> Result<(), workerutil::HandlerError> {
        self.0.start(job.record().id).await;
        Ok(())
    }
}

/// One handler and four jobs claimed beyond it, polling every 20 ms.
pub fn worker_options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = 1;
    o.claim_ahead = Some(JOBS - 1);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    o
}

/// `JOBS` jobs of queue `emails`, of kind `held` with an empty payload
/// (what a client's handler reads), by id.
pub async fn enqueue(pool: &sqlx::PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "WITH added AS (INSERT INTO jobs (queue, kind, payload) SELECT 'emails', 'held', '{}' FROM generate_series(1, $1) RETURNING id) SELECT id FROM added ORDER BY id",
    )
    .bind(i32::try_from(JOBS).unwrap())
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Waits until `store`'s listener is live.
pub async fn listening<R: Record>(store: &DbStore<R>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.wakeups().is_some_and(|w| w.is_live()) {
        assert!(Instant::now() < deadline, "never listening");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the first job runs and the others wait in the buffer, claimed.
pub async fn claimed_ahead(db: &Db, case: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count("processing").await < JOBS as i64 {
        assert!(Instant::now() < deadline, "{case}: never claimed ahead");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long to wait after the pause before the handler frees: a listening
/// worker is told at once; a polling one's buffered jobs must have waited
/// past its second (`RECHECK_AFTER`).
pub fn after_pause(listen: bool) -> Duration {
    Duration::from_millis(if listen { 300 } else { 1_200 })
}

/// Opens the gate, waits for the buffered jobs to be back in the queue.
pub async fn free_the_handler(db: &Db, gate: &Gate, case: &str) {
    gate.open();
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count("queued").await < JOBS as i64 - 1 {
        assert!(
            Instant::now() < deadline,
            "{case}: the buffered jobs were not put back; started {:?}",
            gate.started()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Once the worker stopped: only the job already running ran, and the
/// buffered ones are `queued` counting no failure and no reset, each
/// reported `Outcome::Withheld` for the pause.
pub async fn assert_put_back(
    db: &Db,
    ids: &[i64],
    gate: &Gate,
    events: &mut broadcast::Receiver<WorkerEvent>,
    case: &str,
) {
    assert_eq!(
        gate.started(),
        [ids[0]],
        "{case}: only the job already running ran"
    );
    assert_eq!(db.state(ids[0]).await, "completed", "{case}");
    let counted: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE state = 'queued' AND num_failures = 0 AND num_resets = 0 AND id > $1",
            ids[0],
        )
        .await;
    assert_eq!(
        counted,
        JOBS as i64 - 1,
        "{case}: put back counting nothing"
    );
    let mut withheld = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::JobFinished { id, outcome, .. } = event {
            match outcome {
                Outcome::Withheld(reason) => {
                    assert!(reason.contains("paused"), "{case}: {reason}");
                    withheld.push(id);
                }
                Outcome::Completed => assert_eq!(id, ids[0], "{case}"),
                other => panic!("{case}: job {id} reported {other:?}"),
            }
        }
    }
    withheld.sort();
    assert_eq!(withheld, ids[1..], "{case}: reported withheld");
}

/// Another program's clients: transactions through PgBouncer, one after
/// the other, until `stop`; returns how many committed.
pub fn other_program(
    pool: sqlx::PgPool,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let done = Arc::new(AtomicU64::new(0));
        let clients: Vec<_> = (0..2)
            .map(|_| {
                let (pool, stop, done) = (pool.clone(), stop.clone(), done.clone());
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let mut tx = pool.begin().await.expect("its transaction");
                        sqlx::raw_sql("SELECT pg_sleep(0.005)")
                            .execute(&mut *tx)
                            .await
                            .expect("its statement");
                        tx.commit().await.expect("its commit");
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.expect("a client of the other program");
        }
        done.load(Ordering::SeqCst)
    })
}
