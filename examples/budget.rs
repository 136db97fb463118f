//! A resource-aware worker: every job has a cost, and the jobs running at once
//! never cost more than the budget. `pre_dequeue` only asks for jobs that fit the
//! remaining headroom, `pre_handle` takes a job's cost, `post_handle` gives it back.
//!
//! ```sh
//! cargo run --example budget
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use dbworker::{DbConditions, DbJob, DbStore, JobTable, JobTableOptions, StoreOptions, new_worker};
use dbworker_testkit::TestDatabase;
use workerutil::{BoxError, Handler, HandlerError, JobContext, Outcome, Record, WorkerOptions};

const BUDGET: i64 = 100;

#[derive(Debug, sqlx::FromRow)]
struct CostlyJob {
    id: i64,
    cost: i32,
}

impl Record for CostlyJob {
    fn id(&self) -> i64 {
        self.id
    }
}

#[derive(Default)]
struct Budgeted {
    in_use: AtomicI64,
    peak: AtomicI64,
}
impl Handler<DbStore<CostlyJob>> for Budgeted {
    async fn pre_dequeue(&self) -> Result<Option<DbConditions>, BoxError> {
        let headroom = BUDGET - self.in_use.load(Ordering::SeqCst);
        if headroom <= 0 {
            return Ok(None);
        }
        // Skip jobs larger than what is left; the value is bound, not formatted.
        Ok(Some(
            DbConditions::new().and_sql("j.cost <= $1", [headroom]),
        ))
    }

    async fn pre_handle(&self, record: &CostlyJob) {
        let now = self
            .in_use
            .fetch_add(i64::from(record.cost), Ordering::SeqCst)
            + i64::from(record.cost);
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    async fn handle(
        &self,
        job: &mut DbJob<CostlyJob>,
        _ctx: &JobContext<DbStore<CostlyJob>>,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(
            5 * u64::try_from(job.record().cost).unwrap_or(0),
        ))
        .await;
        Ok(())
    }

    async fn post_handle(&self, record: &CostlyJob, _outcome: &Outcome) {
        self.in_use
            .fetch_sub(i64::from(record.cost), Ordering::SeqCst);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(20).await?;
    db.migrate(&sqlx::migrate!("./migrations")).await?;
    sqlx::raw_sql("INSERT INTO example_jobs (cost) SELECT 10 + (i * 37) % 60 FROM generate_series(1, 40) AS i")
        .execute(&pool)
        .await?;

    let table = JobTable::new(&pool, JobTableOptions::new("example_jobs j")).await?;
    let options = StoreOptions::new("budget_store");
    let store = Arc::new(DbStore::new(&pool, &table, options).await?);

    let handler = Arc::new(Budgeted::default());
    let mut worker_options = WorkerOptions::new("budget_worker");
    worker_options.num_handlers = 8;
    // The condition is per row: claim one job per call so the sum stays in budget.
    worker_options.max_per_dequeue = Some(1);
    worker_options.num_total_jobs = Some(40);
    worker_options.interval = Duration::from_millis(10);
    worker_options.heartbeat_failure_limit = Some(Duration::from_secs(10));
    new_worker(store, handler.clone(), worker_options)?
        .run()
        .await;

    let peak = handler.peak.load(Ordering::SeqCst);
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM example_jobs WHERE state = 'completed'")
            .persistent(false)
            .fetch_one(&mut *pool.begin().await?)
            .await?;
    println!("{done} jobs completed; peak cost in use {peak} of a budget of {BUDGET}");
    assert_eq!(done, 40);
    assert!(peak <= BUDGET, "the budget was exceeded: {peak}");
    pool.close().await;
    Ok(())
}
