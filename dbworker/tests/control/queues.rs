//! Named queues in one process on real Postgres: each queue is claimed with its
//! own condition and never runs more jobs at once than its handler count.

use crate::TIMED;
use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbworker::{
    DbJob, DbStore, Enqueuer, Error, JobTable, NewJob, StoreOptions,
    queues::{QueueWorkers, QueueWorkersOptions},
};
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use common::{Db, QueuedJob};

type Store = DbStore<QueuedJob>;

/// Works 20 ms per job, tracking how many of each queue run at once and which
/// worker ran each queue's jobs.
#[derive(Default)]
struct Tracker {
    running: Mutex<HashMap<String, usize>>,
    most: Mutex<HashMap<String, usize>>,
    workers: Mutex<HashMap<String, String>>,
}
impl Handler<Store> for Tracker {
    async fn handle(
        &self,
        job: &mut DbJob<QueuedJob>,
        ctx: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        let queue = job.record().queue.clone();
        {
            let mut running = self.running.lock().unwrap();
            let now = running.entry(queue.clone()).or_default();
            *now += 1;
            let mut most = self.most.lock().unwrap();
            let top = most.entry(queue.clone()).or_default();
            *top = (*top).max(*now);
        }
        self.workers
            .lock()
            .unwrap()
            .insert(queue.clone(), ctx.worker_name().to_owned());
        tokio::time::sleep(Duration::from_millis(20)).await;
        *self.running.lock().unwrap().get_mut(&queue).unwrap() -= 1;
        Ok(())
    }
}

async fn set_up() -> (Db, JobTable, Arc<Store>) {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let store = Arc::new(
        DbStore::new(&db.pool, &table, store_options())
            .await
            .unwrap(),
    );
    (db, table, store)
}

fn store_options() -> StoreOptions {
    StoreOptions::new("queues")
}

#[tokio::test]
async fn each_queue_runs_at_most_its_handler_count_and_only_its_own_jobs() {
    let _shared = TIMED.read().await;
    let (db, table, store) = set_up().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let mut jobs = Vec::new();
    for (queue, n) in [("emails", 12), ("reports", 4), ("unserved", 2)] {
        jobs.extend((0..n).map(|_| NewJob::new().queue(queue)));
    }
    enqueuer.enqueue_many(&jobs).await.unwrap();

    let tracker = Arc::new(Tracker::default());
    let options = QueueWorkersOptions::new(WorkerOptions::new("app"))
        .queue("emails", 3)
        .queue("reports", 1);
    let workers = QueueWorkers::new(store, tracker.clone(), options).unwrap();
    let shutdown = workers.shutdown_handle();
    let run = tokio::spawn(workers.run());
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.count("completed").await < 16 {
        assert!(Instant::now() < deadline, "the queues did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    let summaries = run.await.unwrap();
    assert_eq!(summaries.len(), 2);

    let most = tracker.most.lock().unwrap().clone();
    assert_eq!(most.get("emails"), Some(&3), "{most:?}");
    assert_eq!(most.get("reports"), Some(&1), "{most:?}");
    let workers = tracker.workers.lock().unwrap().clone();
    assert_eq!(workers["emails"], "app:emails");
    assert_eq!(workers["reports"], "app:reports");
    assert_eq!(db.count("queued").await, 2, "no worker serves `unserved`");
}

/// A `QueueWorkers` (and each worker in it) is a `Service`: it runs until
/// its token fires, then stops gracefully; a worker runs once.
#[tokio::test]
async fn queue_workers_run_as_a_service_until_stopped_and_only_once() {
    let _shared = TIMED.read().await;
    let (db, table, store) = set_up().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let jobs: Vec<NewJob> = (0..6).map(|_| NewJob::new().queue("emails")).collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let options = QueueWorkersOptions::new(WorkerOptions::new("app")).queue("emails", 2);
    let workers =
        Arc::new(QueueWorkers::new(store, Arc::new(Tracker::default()), options).unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let run = {
        let (workers, stop) = (workers.clone(), stop.clone());
        tokio::spawn(async move { dbworker::Service::run(&*workers, stop).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.count("completed").await < 6 {
        assert!(Instant::now() < deadline, "the queue did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!run.is_finished(), "it runs until stopped, not until empty");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("stopped within the drain timeout")
        .unwrap()
        .unwrap();
    let again = dbworker::Service::run(&*workers, tokio_util::sync::CancellationToken::new()).await;
    assert!(
        matches!(again, Err(Error::Worker(workerutil::Error::AlreadyRan))),
        "{again:?}"
    );
}

#[tokio::test]
async fn the_pool_must_serve_every_queue_at_once() {
    let _shared = TIMED.read().await;
    let (db, table, _) = set_up().await;
    let small = db.db.pool(6).await.unwrap();
    let store = Arc::new(DbStore::new(&small, &table, store_options()).await.unwrap());
    let options = QueueWorkersOptions::new(WorkerOptions::new("app"))
        .queue("emails", 3)
        .queue("reports", 1);
    let err = QueueWorkers::new(store.clone(), Tracker::default(), options).unwrap_err();
    // 4 handlers + 2 for each of the 2 queues' claims and heartbeats.
    assert!(
        matches!(err, Error::PoolTooSmall { needed: 8, .. }),
        "{err}"
    );
    let options = QueueWorkersOptions::new(WorkerOptions::new("app"))
        .queue("emails", 1)
        .queue("emails", 1);
    let err = QueueWorkers::new(store, Tracker::default(), options).unwrap_err();
    assert!(err.to_string().contains("named twice"), "{err}");
}

#[tokio::test]
async fn the_queue_column_comes_from_the_table_and_a_table_without_one_is_refused() {
    let _shared = TIMED.read().await;
    // The store's table names no queue column: nothing to claim by.
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let table = db.table().await;
    let store = Arc::new(
        DbStore::new(&db.pool, &table, store_options())
            .await
            .unwrap(),
    );
    let options = QueueWorkersOptions::new(WorkerOptions::new("app")).queue("emails", 1);
    let err = QueueWorkers::new(store, Tracker::default(), options).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidOption {
                field: "queue_column",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("JobTableOptions::queue_column"),
        "{err}"
    );
}
