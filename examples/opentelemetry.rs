//! Traces through OpenTelemetry: the worker's `job` spans (fields `worker`
//! and `record_id`), the handler's own child spans and the job's failure, all
//! exported as OpenTelemetry spans by `tracing-opentelemetry`.
//!
//! This example exports to standard output so it runs without a collector;
//! in a service, swap the exporter for OTLP (`opentelemetry-otlp`'s
//! `SpanExporter::builder().with_tonic().build()?`) and a batch processor
//! (`with_batch_exporter`), and keep the rest.
//!
//! ```sh
//! cargo run --example opentelemetry
//! ```

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, JobTable, JobTableOptions, StoreOptions, ddl::job_table_sql, new_worker,
};
use dbworker_testkit::TestDatabase;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Email {
    id: i64,
    address: String,
}

impl Record for Email {
    fn id(&self) -> i64 {
        self.id
    }
}

struct SendEmail;
impl Handler<DbStore<Email>> for SendEmail {
    async fn handle(
        &self,
        job: &mut DbJob<Email>,
        _ctx: &JobContext<DbStore<Email>>,
    ) -> Result<(), HandlerError> {
        let address = job.record().address.clone();
        // A child of the worker's `job` span, so the trace shows both.
        let span = tracing::info_span!("smtp_send", address = %address);
        let _entered = span.enter();
        if address.ends_with(".invalid") {
            return Err(HandlerError::non_retryable(format!(
                "no mail server for {address}"
            )));
        }
        tracing::info!("sent");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let tracer = provider.tracer("dbworker-example");
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info,sqlx=warn"))
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .init();

    let db = TestDatabase::new().await?;
    let pool = db.pool(5).await?;
    let ddl = job_table_sql("emails", &Default::default())?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;
    sqlx::raw_sql(
        "ALTER TABLE emails ADD COLUMN address text NOT NULL;
         INSERT INTO emails (address) VALUES ('ada@example.com'), ('bob@example.com'), ('eve@mail.invalid');",
    )
    .execute(&pool)
    .await?;

    let table = JobTable::new(&pool, JobTableOptions::new("emails e")).await?;
    let so = StoreOptions::new("emails");
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let mut wo = WorkerOptions::new("otel-example");
    wo.num_handlers = 2;
    wo.interval = Duration::from_millis(50);
    let worker = new_worker(store, Arc::new(SendEmail), wo)?;
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM emails WHERE state IN ('completed', 'failed')",
    )
    .persistent(false)
    .fetch_one(&mut *pool.begin().await?)
    .await?
        < 3
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    run.await?;
    // Flushes every span still in the pipeline before the process exits.
    provider.shutdown()?;
    pool.close().await;
    Ok(())
}
