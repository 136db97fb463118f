//! Metrics in Prometheus's format: the exporter installed as the `metrics`
//! recorder, a worker with two kinds of job, the queue gauges and the purger,
//! then the scrape text. In a service, serve it: enable the exporter's
//! `http-listener` feature and call `PrometheusBuilder::with_http_listener`
//! instead of `install_recorder`.
//!
//! ```sh
//! cargo run --example prometheus
//! ```

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Enqueuer, JobTable, JobTableOptions, NewJob, StoreOptions,
    ddl::{OptionalColumns, job_table_sql, optional_columns_sql},
    maintenance::{PurgeOptions, Purger},
    new_worker,
};
use dbworker_testkit::TestDatabase;
use metrics_exporter_prometheus::PrometheusBuilder;
use workerutil::{
    Handler, HandlerError, JobContext, JobState, KindRegistry, Record, WorkerOptions,
};

#[derive(Debug, sqlx::FromRow)]
struct Job {
    id: i64,
    kind: String,
}

impl Record for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Succeeds, or fails for good: one handler per kind.
struct Outcome(bool);
impl Handler<DbStore<Job>> for Outcome {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        if self.0 {
            Ok(())
        } else {
            Err(HandlerError::non_retryable(
                "the report template is missing",
            ))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    let mut columns = OptionalColumns::default();
    columns.kind = true;
    columns.queue = true;
    let mut ddl = job_table_sql("jobs", &Default::default())?;
    ddl.push_str(&optional_columns_sql("jobs", &Default::default(), columns)?);
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, described and checked once: the enqueuer, the store and
    // the purger take it.
    let mut to = JobTableOptions::new("jobs j");
    to.kind_column = Some("kind".into());
    to.queue_column = Some("queue".into());
    let table = JobTable::new(&pool, to).await?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;
    let mut jobs: Vec<NewJob> = (0..20).map(|_| NewJob::new().kind("email")).collect();
    jobs.extend((0..5).map(|_| NewJob::new().kind("report").queue("reports")));
    jobs.extend((0..3).map(|_| {
        NewJob::new()
            .kind("email")
            .run_after(Duration::from_secs(600))
    }));
    enqueuer.enqueue_many(&jobs).await?;

    let mut so = StoreOptions::new("jobs");
    so.max_num_retries = 0;
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let registry = KindRegistry::<DbStore<Job>>::new(|j: &Job| j.kind.as_str())
        .register("email", Outcome(true))?
        .register("report", Outcome(false))?;
    let mut wo = WorkerOptions::new("prometheus-example");
    wo.num_total_jobs = Some(25);
    new_worker(store.clone(), registry, wo)?.run().await;

    // Gauges come from one cheap query; the `QueueGauges` service runs it on a timer.
    store.record_gauges(&mut Vec::new()).await?;
    let mut po = PurgeOptions::new();
    po.max_age = vec![(JobState::Completed, Duration::ZERO)];
    Purger::new(&pool, &table, po).await?.purge_once().await?;

    let text = metrics.render();
    for line in text.lines().filter(|l| {
        !l.starts_with('#')
            && [
                "workerutil_jobs_total",
                "workerutil_jobs_by_kind_total",
                "dbworker_",
            ]
            .iter()
            .any(|p| l.starts_with(p))
    }) {
        println!("{line}");
    }
    pool.close().await;
    Ok(())
}
