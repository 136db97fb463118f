//! Quickstart: a job table, twenty jobs, a worker and a resetter.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! Needs no set-up: with `DATABASE_URL` unset it starts a throwaway PostgreSQL
//! cluster (the server binaries must be installed); with it set, it creates a
//! scratch database on that server and drops it at the end.

use std::sync::Arc;
use std::time::Duration;

use dbworker::{DbJob, DbStore, Resetter, StoreOptions, new_worker, store::Listen};
use dbworker_testkit::TestDatabase;
use tokio_util::sync::CancellationToken;
use workerutil::{
    ExecutionLogEntry, Handler, HandlerError, JobContext, Record, WorkerEvent, WorkerOptions,
    async_trait,
};

/// One row of `example_jobs`, read with `sqlx::FromRow`.
#[derive(Debug, sqlx::FromRow)]
struct ExampleJob {
    id: i64,
    payload: serde_json::Value,
}

impl Record for ExampleJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Squares the job's number and stores the result, in the job's transaction.
struct Squarer;

#[async_trait]
impl Handler<DbStore<ExampleJob>> for Squarer {
    async fn handle(
        &self,
        job: &mut DbJob<ExampleJob>,
        ctx: &JobContext<DbStore<ExampleJob>>,
    ) -> Result<(), HandlerError> {
        let Some(n) = job.record().payload["n"].as_i64() else {
            // Retrying cannot fix a malformed payload.
            return Err(HandlerError::non_retryable("payload has no integer `n`"));
        };
        let step = ExecutionLogEntry {
            key: "square".into(),
            command: vec!["square".into(), n.to_string()],
            ..Default::default()
        };
        let index = ctx.log(&step).await.map_err(HandlerError::Retryable)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let id = job.record().id;
        let tx = job.tx().expect("transactional handling");
        // Commits together with the job's `completed` state, or not at all.
        sqlx::query("INSERT INTO squares (job_id, n, square) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(n)
            .bind(n * n)
            .execute(tx)
            .await?;
        if let Some(index) = index {
            let done = ExecutionLogEntry {
                exit_code: Some(0),
                out: format!("{}\n", n * n),
                duration_ms: Some(50),
                ..step
            };
            ctx.update_log(index, &done)
                .await
                .map_err(HandlerError::Retryable)?;
        }
        Ok(())
    }
}

fn print_event(event: &WorkerEvent) {
    if let WorkerEvent::JobFinished {
        id,
        outcome,
        marked,
    } = event
    {
        let detail = outcome
            .failure_message()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let note = if *marked { "" } else { " (not recorded)" };
        println!("job {id:>2} {}{detail}{note}", outcome.kind());
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    sqlx::migrate!("./migrations").run(&pool).await?;
    sqlx::raw_sql("CREATE TABLE squares (job_id bigint PRIMARY KEY, n bigint NOT NULL, square bigint NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO example_jobs (payload) SELECT jsonb_build_object('n', i) FROM generate_series(1, 20) AS i")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO example_jobs (payload) VALUES ('{\"n\": \"not a number\"}')")
        .execute(&pool)
        .await?;
    println!(
        "enqueued 21 jobs in {} (one with a malformed payload)",
        db.name()
    );

    let mut options = StoreOptions::<ExampleJob>::from_row("example_store", "example_jobs j");
    options.column_expressions = vec!["j.id".into(), "j.payload".into()];
    options.stalled_max_age = Duration::from_secs(5);
    // Wake the worker with LISTEN/NOTIFY (the trigger is in migrations/0002).
    options.listen = Listen::TableChannel;
    let store = Arc::new(DbStore::new(&pool, options).await?);

    let mut worker_options = WorkerOptions::new("example_worker");
    worker_options.num_handlers = 4;
    worker_options.interval = Duration::from_millis(100);
    // Notifications bring new jobs at once, so an idle worker may poll rarely.
    worker_options.max_interval = Some(Duration::from_secs(30));
    worker_options.heartbeat_interval = Duration::from_millis(500);
    worker_options.heartbeat_failure_limit = Some(Duration::from_secs(3));
    let worker = new_worker(store.clone(), Squarer, worker_options)?;
    let shutdown = worker.shutdown_handle();
    let mut events = worker.subscribe();

    let resetter = Resetter::for_store(&store, Duration::from_secs(1))?;
    let stop_resetter = CancellationToken::new();
    let resetter_task = {
        let stop = stop_resetter.clone();
        tokio::spawn(async move { resetter.run(stop, |_| {}).await })
    };

    let run = tokio::spawn(worker.run());
    // Print progress; stop once no job waits or runs (asked of the database,
    // which is the one place that knows).
    loop {
        if let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await
        {
            print_event(&event);
        }
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM example_jobs WHERE state IN ('queued', 'errored', 'processing')",
        )
        .fetch_one(&pool)
        .await?;
        if open == 0 {
            break;
        }
    }
    shutdown.graceful();
    let summary = run.await?;
    while let Ok(event) = events.try_recv() {
        print_event(&event);
    }
    stop_resetter.cancel();
    resetter_task.await?;
    // Closes the store's LISTEN connection before the database goes at the end.
    store.close().await;

    let counts: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM example_jobs GROUP BY state ORDER BY state")
            .fetch_all(&pool)
            .await?;
    let total: i64 = sqlx::query_scalar("SELECT coalesce(sum(square), 0)::bigint FROM squares")
        .fetch_one(&pool)
        .await?;
    println!(
        "worker stopped ({:?}) after {} jobs",
        summary.reason, summary.dequeued
    );
    for (state, n) in counts {
        println!("  {state:<10} {n}");
    }
    println!("sum of squares 1..=20 = {total}");
    assert_eq!(
        total,
        (1..=20).map(|n: i64| n * n).sum::<i64>(),
        "every job's write committed once"
    );
    pool.close().await;
    Ok(())
}
