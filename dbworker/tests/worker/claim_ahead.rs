//! Claim-ahead on real Postgres: a worker holds at most `num_handlers +
//! claim_ahead` jobs, hands every unstarted one back on either shutdown, and
//! never reports a job lost that simply finished during a heartbeat.

use crate::common;

use dbworker::{DbJob, DbStore, Handling, new_worker};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use workerutil::testing::wait_for;
use workerutil::{Handler, HandlerError, JobContext, StopReason, WorkerEvent, WorkerOptions};

use common::Db;

/// Each job waits for a permit, so the test decides when jobs finish.
struct Gate(Arc<Semaphore>);
impl Handler<DbStore<common::Job>> for Gate {
    async fn handle(
        &self,
        _job: &mut DbJob<common::Job>,
        _ctx: &JobContext<DbStore<common::Job>>,
    ) -> Result<(), HandlerError> {
        // A shutdown drops this future while it waits: the worker requeues the job.
        self.0.acquire().await.expect("open").forget();
        Ok(())
    }
}

fn options(handlers: usize, ahead: usize) -> WorkerOptions {
    let mut o = WorkerOptions::new("ahead");
    o.num_handlers = handlers;
    o.claim_ahead = Some(ahead);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.drain_timeout = Duration::from_secs(30);
    o.event_capacity = 16_384;
    o
}

async fn wait_processing(db: &Db, n: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while db.count("processing").await != n {
        assert!(
            std::time::Instant::now() < deadline,
            "never reached {n} processing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn handed_back(events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>, n: usize) {
    for _ in 0..n {
        let requeued = wait_for(events, |e| match e {
            WorkerEvent::HandedBack { requeued, .. } => Some(*requeued),
            _ => None,
        })
        .await;
        assert!(requeued, "a buffered job was not taken back");
    }
}

#[tokio::test]
async fn the_buffer_stays_bounded_and_goes_back_on_a_graceful_shutdown() {
    let db = Db::new().await;
    db.enqueue(20, json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let gate = Arc::new(Semaphore::new(0));
    let worker = new_worker(store, Gate(gate.clone()), options(2, 3)).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_processing(&db, 5).await;
    // Let three jobs finish: their slots refill from the buffer and the buffer
    // refills, but the worker never holds more than 2 + 3.
    gate.add_permits(3);
    for _ in 0..3 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::JobFinished { .. }).then_some(())
        })
        .await;
    }
    for _ in 0..20 {
        assert!(db.count("processing").await <= 5);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_processing(&db, 5).await;
    shutdown.graceful();
    handed_back(&mut events, 3).await;
    // The buffer went back at once; the two running jobs are still draining.
    assert_eq!(db.count("processing").await, 2);
    assert_eq!(db.count("queued").await, 15);
    gate.add_permits(2);
    let summary = run.await.unwrap();
    assert_eq!(summary.reason, StopReason::Graceful);
    assert_eq!(db.count("completed").await, 5);
    assert_eq!(db.count("queued").await, 15);
}

#[tokio::test]
async fn an_immediate_shutdown_hands_back_buffered_transactional_jobs() {
    let db = Db::new().await;
    db.enqueue(10, json!({})).await;
    let store = db.store(Handling::Transactional).await;
    let worker = new_worker(store, Gate(Arc::new(Semaphore::new(0))), options(3, 2)).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_processing(&db, 5).await;
    shutdown.immediate();
    handed_back(&mut events, 2).await;
    assert_eq!(run.await.unwrap().reason, StopReason::Immediate);
    assert_eq!(db.count("processing").await, 0);
    assert_eq!(db.count("queued").await, 10);
    let failures: i64 = sqlx::query_scalar("SELECT sum(num_failures) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0, "handing back is not a failure");
}

#[tokio::test]
async fn jobs_finishing_during_heartbeats_are_never_reported_lost() {
    let db = Db::new().await;
    db.enqueue(1500, json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let mut o = options(8, 8);
    // Heartbeats all the time, so many are in flight as jobs finish.
    o.heartbeat_interval = Duration::from_millis(1);
    o.num_total_jobs = Some(1500);
    let worker = new_worker(store, Gate(Arc::new(Semaphore::new(1500))), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let mut heartbeats = 0;
    loop {
        match events.recv().await {
            Ok(WorkerEvent::Heartbeat { lost, .. }) => {
                heartbeats += 1;
                assert!(lost.is_empty(), "finished jobs reported lost: {lost:?}");
            }
            Ok(WorkerEvent::JobFinished {
                outcome, marked, ..
            }) => {
                assert!(marked, "{outcome:?}");
            }
            Ok(WorkerEvent::Stopped) => break,
            Ok(_) => {}
            Err(err) => panic!("{err}"),
        }
    }
    run.await.unwrap();
    assert!(heartbeats > 0);
    assert_eq!(db.count("completed").await, 1500);
}
