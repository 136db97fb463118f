//! Many kinds of job in one table, served by one process: a `KindRegistry`
//! runs each job with the handler registered for its `kind` (an unknown kind
//! fails with a clear message), and `QueueWorkers` gives each named queue its
//! own handler count, so a slow `reports` queue never takes the `emails` slots.
//!
//! ```sh
//! cargo run --example kinds
//! ```

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Enqueuer, JobTable, JobTableOptions, NewJob, StoreOptions,
    ddl::{OptionalColumns, job_table_sql, optional_columns_sql},
    queues::{QueueWorkers, QueueWorkersOptions},
};
use dbworker_testkit::TestDatabase;
use workerutil::{Handler, HandlerError, JobContext, KindRegistry, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Job {
    id: i64,
    kind: String,
    payload: serde_json::Value,
}

impl Record for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

struct SendEmail;
impl Handler<DbStore<Job>> for SendEmail {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let to = job.record().payload["to"]
            .as_str()
            .ok_or_else(|| HandlerError::non_retryable("payload has no `to`"))?;
        tracing::info!(to, "email sent");
        Ok(())
    }
}

struct BuildReport;
impl Handler<DbStore<Job>> for BuildReport {
    async fn handle(
        &self,
        _: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    let mut columns = OptionalColumns::default();
    columns.kind = true;
    columns.queue = true;
    let mut ddl = job_table_sql("jobs", &Default::default())?;
    ddl.push_str(&optional_columns_sql("jobs", &Default::default(), columns)?);
    ddl.push_str("ALTER TABLE jobs ADD COLUMN payload jsonb NOT NULL DEFAULT '{}';");
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, described and checked once: the enqueuer and the store take it.
    let mut to = JobTableOptions::new("jobs j");
    to.kind_column = Some("kind".into());
    to.queue_column = Some("queue".into());
    let table = JobTable::new(&pool, to).await?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;
    let mut jobs: Vec<NewJob> = (0..12)
        .map(|i| {
            NewJob::new().kind("send_email").queue("emails").json(
                "payload",
                serde_json::json!({ "to": format!("user{i}@example.com") }),
            )
        })
        .collect();
    jobs.extend((0..3).map(|_| NewJob::new().kind("build_report").queue("reports")));
    jobs.push(NewJob::new().kind("send_sms").queue("emails"));
    enqueuer.enqueue_many(&jobs).await?;

    let so = StoreOptions::new("app");
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let registry = KindRegistry::<DbStore<Job>>::new(|j: &Job| j.kind.as_str())
        .register("send_email", SendEmail)?
        .register("build_report", BuildReport)?;
    let mut wo = WorkerOptions::new("app");
    wo.interval = Duration::from_millis(50);
    let options = QueueWorkersOptions::new(wo)
        .queue("emails", 4)
        .queue("reports", 1);
    let workers = QueueWorkers::new(store, registry, options)?;
    let shutdown = workers.shutdown_handle();
    let run = tokio::spawn(workers.run());
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM jobs WHERE state IN ('completed', 'failed')",
    )
    .persistent(false)
    .fetch_one(&mut *pool.begin().await?)
    .await?
        < 16
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    for summary in run.await? {
        println!("{summary:?}");
    }
    let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT kind, queue, state, failure_message FROM jobs GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3",
    )
    .persistent(false)
    .fetch_all(&mut *pool.begin().await?)
    .await?;
    for (kind, queue, state, failure) in rows {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = $1 AND state = $2")
            .bind(&kind)
            .bind(&state)
            .persistent(false)
            .fetch_one(&mut *pool.begin().await?)
            .await?;
        println!(
            "{kind:<13} {queue:<8} {state:<10} {n:>3} {}",
            failure.unwrap_or_default()
        );
    }
    pool.close().await;
    Ok(())
}
