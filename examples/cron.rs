//! Periodic jobs: two schedulers — as two processes would — run the same
//! every-second schedule against one table for three seconds; each tick is
//! enqueued exactly once (its key is the schedule name and the tick time), and
//! a worker runs the jobs.
//!
//! ```sh
//! cargo run --example cron
//! ```

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, JobTable, JobTableOptions, NewJob, StoreOptions,
    cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions},
    ddl::{cron_table_sql, job_table_sql},
    new_worker,
};
use dbworker_testkit::TestDatabase;
use tokio_util::sync::CancellationToken;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Job {
    id: i64,
}

impl Record for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

struct Cleanup;
impl Handler<DbStore<Job>> for Cleanup {
    async fn handle(
        &self,
        _: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    let mut ddl = job_table_sql("jobs", &Default::default())?;
    ddl.push_str("ALTER TABLE jobs ADD COLUMN payload jsonb NOT NULL DEFAULT '{}';");
    ddl.push_str(&cron_table_sql(DEFAULT_CRON_TABLE)?);
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, described and checked once: both schedulers and the
    // store take it.
    let table = JobTable::new(&pool, JobTableOptions::new("jobs j")).await?;

    let stop = CancellationToken::new();
    let mut schedulers = Vec::new();
    let mut pools = Vec::new();
    for _ in 0..2 {
        // Each on a pool of its own: another process, as Postgres sees it.
        let own = db.pool(2).await?;
        pools.push(own.clone());
        let options = SchedulerOptions::default();
        let scheduler = Scheduler::new(&own, &table, options).await?.add(
            "cleanup",
            "* * * * * *", // six fields: every second
            NewJob::new().json("payload", serde_json::json!({ "task": "cleanup" })),
            Backfill::Skip {
                grace: Duration::from_secs(5),
            },
        )?;
        let stop = stop.clone();
        // `Scheduler::run(stop)` does this loop; here each counts what it enqueued.
        schedulers.push(tokio::spawn(async move {
            let mut enqueued = 0;
            while !stop.is_cancelled() {
                enqueued += scheduler.tick().await.map(|e| e.len()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            enqueued
        }));
    }

    let so = StoreOptions::new("cron");
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let mut wo = WorkerOptions::new("cron-example");
    wo.interval = Duration::from_millis(50);
    let worker = new_worker(store, Arc::new(Cleanup), wo)?;
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());

    tokio::time::sleep(Duration::from_millis(3200)).await;
    stop.cancel();
    let mut by_scheduler = Vec::new();
    for s in schedulers {
        by_scheduler.push(s.await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.graceful();
    run.await?;

    let (jobs, completed): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM jobs")
            .persistent(false)
            .fetch_one(&mut *pool.begin().await?)
            .await?;
    println!("enqueued by scheduler: {by_scheduler:?}");
    println!("jobs: {jobs}, completed: {completed} (one per second, however many schedulers)");
    for own in pools {
        own.close().await;
    }
    pool.close().await;
    Ok(())
}
