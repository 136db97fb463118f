//! Global concurrency limits on real Postgres: four worker pools of sixteen
//! handlers never run more jobs of a limited queue at once than its limit,
//! while other queues run freely; a limit of 0 stops a queue.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    DEFAULT_LIMIT_TABLE, DbConditions, DbJob, DbStore, EnqueueOptions, Enqueuer, Handling, Limits,
    NewJob, StoreOptions, limit_table_sql, new_worker,
};
use workerutil::{Handler, HandlerError, JobContext, Record, Store, WorkerOptions, async_trait};

use common::Db;

#[derive(Debug, sqlx::FromRow)]
struct QueuedJob {
    id: i64,
    queue: String,
}

impl Record for QueuedJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Counts concurrent jobs per queue across every worker.
#[derive(Default)]
struct Counter {
    reports: AtomicUsize,
    most_reports: AtomicUsize,
    emails: AtomicUsize,
    most_emails: AtomicUsize,
}

#[async_trait]
impl Handler<DbStore<QueuedJob>> for Counter {
    async fn handle(
        &self,
        job: &mut DbJob<QueuedJob>,
        _ctx: &JobContext<DbStore<QueuedJob>>,
    ) -> Result<(), HandlerError> {
        let (now, most, work) = if job.record().queue == "reports" {
            (&self.reports, &self.most_reports, 10)
        } else {
            (&self.emails, &self.most_emails, 5)
        };
        let running = now.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(work)).await;
        now.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn set_up() -> (Db, Limits, Enqueuer) {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap()],
    )
    .await;
    let limits = Limits::new(&db.pool, DEFAULT_LIMIT_TABLE, "jobs")
        .await
        .unwrap();
    let mut eo = EnqueueOptions::new("jobs");
    eo.queue_column = Some("queue".into());
    let enqueuer = Enqueuer::new(&db.pool, eo).await.unwrap();
    (db, limits, enqueuer)
}

/// A store on a pool of its own: another process, as Postgres sees it.
async fn limited_store(db: &Db) -> Arc<DbStore<QueuedJob>> {
    let mut o = StoreOptions::<QueuedJob>::from_row("limited", "jobs j");
    o.column_expressions = vec!["j.id".into(), "j.queue".into()];
    o.handling = Handling::Heartbeat;
    o.queue_column = Some("queue".into());
    o.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    Arc::new(DbStore::new(db.db.pool(8).await.unwrap(), o).await.unwrap())
}

async fn processing_reports(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'processing' AND queue = 'reports'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn four_processes_of_sixteen_handlers_never_exceed_a_queue_limit() {
    let (db, limits, enqueuer) = set_up().await;
    limits.set("reports", 3).await.unwrap();
    let mut jobs: Vec<NewJob> = (0..60).map(|_| NewJob::new().queue("reports")).collect();
    jobs.extend((0..200).map(|_| NewJob::new().queue("emails")));
    enqueuer.enqueue_many(&jobs).await.unwrap();

    let counter = Arc::new(Counter::default());
    let mut shutdowns = Vec::new();
    let mut runs = Vec::new();
    for n in 0..4 {
        let mut o = WorkerOptions::new(format!("process-{n}"));
        o.num_handlers = 16;
        o.interval = Duration::from_millis(20);
        let worker = new_worker(limited_store(&db).await, counter.clone(), o).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    // Watch the table too: claimed-ahead jobs count as processing.
    let mut most_in_table = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.count("completed").await < 260 {
        most_in_table = most_in_table.max(processing_reports(&db).await);
        assert!(Instant::now() < deadline, "the jobs did not finish");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for s in &shutdowns {
        s.graceful();
    }
    for run in runs {
        run.await.unwrap();
    }
    let most = counter.most_reports.load(Ordering::SeqCst);
    assert_eq!(most, 3, "the limit is used, never exceeded");
    assert!(
        most_in_table <= 3,
        "{most_in_table} reports processing at once"
    );
    let emails = counter.most_emails.load(Ordering::SeqCst);
    assert!(
        emails > 3,
        "other queues are not held to the limit: {emails}"
    );
    assert_eq!(limits.list().await.unwrap(), [("reports".to_owned(), 3)]);
}

#[tokio::test]
async fn a_limit_of_zero_stops_a_queue_and_removing_it_frees_it() {
    let (db, limits, enqueuer) = set_up().await;
    let ids = enqueuer
        .enqueue_many(&[
            NewJob::new().queue("reports"),
            NewJob::new().queue("emails"),
        ])
        .await
        .unwrap();
    limits.set("reports", 0).await.unwrap();
    let store = limited_store(&db).await;
    let claimed = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    let claimed: Vec<i64> = claimed.iter().map(|j| j.record().id).collect();
    assert_eq!(claimed, [ids[1]], "only the unlimited queue");
    assert!(limits.remove("reports").await.unwrap());
    let claimed = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.record().id).collect::<Vec<_>>(),
        [ids[0]]
    );
}
