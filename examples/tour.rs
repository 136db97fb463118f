//! A longer tour than the quickstart: typed jobs enqueued many at once, a
//! handler that keeps an execution log and writes in the job's transaction,
//! a payload that does not fit its type (failed at once, the field named),
//! LISTEN/NOTIFY wake-ups, progress from the worker's events, a resetter, and
//! a graceful shutdown once the database says no job is left.
//!
//! ```sh
//! cargo run --example tour
//! ```
//!
//! Zero-config like the quickstart: a throwaway PostgreSQL cluster, or a
//! scratch database on `DATABASE_URL`. Logs go to stderr, coloured only on a
//! terminal; the output is plain text.

use std::io::IsTerminal;
use std::time::Duration;

use dbworker::Listen;
use dbworker::prelude::*;
use dbworker_testkit::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use workerutil::{ExecutionLogEntry, WorkerEvent};

/// The arguments of a `square` job.
#[derive(Debug, Serialize, Deserialize)]
struct Square {
    n: i64,
}

impl JobArgs for Square {
    const KIND: &'static str = "square";

    fn defaults() -> JobDefaults {
        // A job of this kind may run for ten seconds at most.
        JobDefaults::new().timeout(Duration::from_secs(10))
    }
}

/// Squares the number and stores the result in the job's transaction,
/// logging the step in the job's execution log (which survives a rollback).
struct Squarer;
impl JobHandler for Squarer {
    type Args = Square;

    async fn handle(&self, mut job: Job<'_, Square>) -> Result<(), HandlerError> {
        let n = job.args.n;
        let step = ExecutionLogEntry {
            key: "square".into(),
            command: vec!["square".into(), n.to_string()],
            ..Default::default()
        };
        let index = job.log(&step).await.map_err(HandlerError::Retryable)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let id = job.id();
        // Commits together with the job's `completed` state, or not at all.
        // Unnamed (`persistent(false)`), so it also runs behind a transaction
        // pooler, whose server connections other programs' statements share.
        sqlx::query("INSERT INTO tour_squares (job_id, n, square) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(n)
            .bind(n * n)
            .persistent(false)
            .execute(job.tx()?)
            .await?;
        if let Some(index) = index {
            let done = ExecutionLogEntry {
                exit_code: Some(0),
                out: format!("{}\n", n * n),
                duration_ms: Some(50),
                ..step
            };
            job.context()
                .update_log(index, &done)
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
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    db.migrate(&sqlx::migrate!("./migrations")).await?;
    sqlx::raw_sql("CREATE TABLE tour_squares (job_id bigint PRIMARY KEY, n bigint NOT NULL, square bigint NOT NULL)")
        .execute(&pool)
        .await?;

    // The job table, described and checked once; the client enqueues into it
    // and runs its worker and resetter.
    let table = JobTable::new(&pool, JobTableOptions::typed("example_jobs j")).await?;
    let mut store = StoreOptions::new("tour_store");
    store.stall.stalled_max_age = Duration::from_secs(5);
    // Wake the worker with LISTEN/NOTIFY (the trigger is in migrations/0002).
    store.listen = Listen::TableChannel;
    let mut options = ClientOptions::default();
    options.worker = WorkerOptions::new("tour_worker");
    options.worker.num_handlers = 4;
    options.worker.interval = Duration::from_millis(100);
    // Notifications bring new jobs at once, so an idle worker may poll rarely.
    options.worker.max_interval = Some(Duration::from_secs(30));
    options.worker.heartbeat_interval = Duration::from_millis(500);
    options.worker.heartbeat_failure_limit = Some(Duration::from_secs(3));
    // The resetter counts a job as stalled exactly as the store does.
    let mut resetter = ResetterOptions::new("tour_resetter");
    resetter.stall = store.stall.clone();
    resetter.interval = Duration::from_secs(1);
    options.resetter = Some(resetter);
    let client = Client::builder(&pool, &table)
        .handler(Squarer)
        .store_options(store)
        .options(options)
        .build()
        .await?;

    // Twenty jobs in one statement, and one whose payload is not a `Square`
    // (written as plain JSON, as another program might).
    client.enqueue_many((1..=20).map(|n| Square { n })).await?;
    let malformed = NewJob::new()
        .kind(Square::KIND)
        .json("payload", serde_json::json!({"n": "not a number"}));
    client.enqueue(malformed).await?;
    println!(
        "enqueued 21 jobs in {} (one with a malformed payload)",
        db.name()
    );

    let mut events = client.subscribe();
    client.start()?;
    // Print progress; stop once no job waits or runs (asked of the database,
    // which is the one place that knows).
    loop {
        if let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await
        {
            print_event(&event);
        }
        let open: i64 = sqlx::raw_sql(
            "SELECT count(*) FROM example_jobs WHERE state IN ('queued', 'errored', 'processing')",
        )
        .fetch_one(&pool)
        .await?
        .try_get(0)?;
        if open == 0 {
            break;
        }
    }
    // Stops the worker (running jobs drain) and the resetter, and closes the
    // store's LISTEN connection before the database goes at the end.
    let summary = client
        .shutdown()
        .await?
        .ok_or("the client was not started")?;
    while let Ok(event) = events.try_recv() {
        print_event(&event);
    }

    // Simple queries (`raw_sql`), which prepare nothing: safe behind a pooler.
    let counts: Vec<(String, i64)> =
        sqlx::raw_sql("SELECT state, count(*) FROM example_jobs GROUP BY state ORDER BY state")
            .fetch_all(&pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()?;
    let total: i64 = sqlx::raw_sql("SELECT coalesce(sum(square), 0)::bigint FROM tour_squares")
        .fetch_one(&pool)
        .await?
        .try_get(0)?;
    let logged: i64 = sqlx::raw_sql(
        "SELECT count(*) FROM example_jobs WHERE execution_logs[1]->>'exit_code' = '0'",
    )
    .fetch_one(&pool)
    .await?
    .try_get(0)?;
    println!(
        "worker stopped ({:?}) after {} jobs",
        summary.reason, summary.dequeued
    );
    for (state, n) in counts {
        println!("  {state:<10} {n}");
    }
    println!("execution logs with a finished step: {logged}");
    println!("sum of squares 1..=20 = {total}");
    assert_eq!(
        total,
        (1..=20).map(|n: i64| n * n).sum::<i64>(),
        "every job's write committed once"
    );
    pool.close().await;
    Ok(())
}
