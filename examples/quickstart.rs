//! Quickstart: a typed job, enqueued and run by a worker beside a resetter, its handler writing
//! in the job's transaction. Needs no set-up: with `DATABASE_URL` unset it starts a throwaway
//! PostgreSQL cluster. The guide's "Typed jobs" chapter explains each piece.

use dbworker::prelude::*;
use dbworker::workerutil::{CancellationToken, WorkerEvent};
use serde::{Deserialize, Serialize};
use sqlx::Row;

/// A job's arguments: JSON in the `payload` column, `"square"` in `kind`.
#[derive(Serialize, Deserialize)]
struct Square {
    n: i64,
}

impl JobArgs for Square {
    const KIND: &'static str = "square";
}

/// Stores n² in the job's transaction: it commits with the job's completion.
struct Squarer;
impl JobHandler for Squarer {
    type Args = Square;

    async fn handle(
        &self,
        args: Square,
        job: &mut DbJob<TypedJob>,
        _: &JobContext<DbStore<TypedJob>>,
    ) -> Result<(), HandlerError> {
        let tx = job.tx().expect("transactional handling, the default");
        // Unnamed, so it also runs behind a transaction pooler (PgBouncer).
        sqlx::query("INSERT INTO squares VALUES ($1, $1 * $1)")
            .bind(args.n)
            .persistent(false)
            .execute(tx)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = dbworker_testkit::TestDatabase::new().await?; // a throwaway cluster, or DATABASE_URL
    let pool = db.pool(10).await?;
    sqlx::migrate!("./migrations").run(&pool).await?; // `example_jobs`, with `kind` and `payload`
    sqlx::raw_sql("CREATE TABLE squares (n bigint PRIMARY KEY, square bigint)")
        .execute(&pool)
        .await?;

    // The job table, described and checked once: every service below takes it.
    let jobs = JobTable::new(&pool, JobTableOptions::typed("example_jobs")).await?;
    let enqueuer = Enqueuer::new(&pool, &jobs).await?;
    for n in 1..=20 {
        enqueuer.enqueue_args(&Square { n }).await?;
    }
    println!("enqueued 20 jobs of kind \"square\"");

    let store = DbStore::new(&pool, &jobs, StoreOptions::from_row("quickstart")).await?;
    // Requeues the jobs of dead workers, stalled by the store's own measure.
    let resetter = Resetter::new(&pool, &jobs, ResetterOptions::for_store(&store))?;
    let store = std::sync::Arc::new(store);
    let registry = KindRegistry::for_args().register_args(Squarer);
    let worker = new_worker(store.clone(), registry, WorkerOptions::new("quickstart"))?;
    let mut events = worker.subscribe();
    let stop = CancellationToken::new();
    let run = async {
        worker.run_until_empty().await;
        stop.cancel()
    };
    tokio::join!(run, resetter.run(stop.clone(), |_| {}));

    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::JobFinished { id, outcome, .. } = event {
            println!("job {id:>2} {}", outcome.kind());
        }
    }
    let sum: i64 = sqlx::raw_sql("SELECT sum(square)::bigint FROM squares")
        .fetch_one(&pool)
        .await?
        .try_get(0)?;
    println!("sum of squares 1..=20 = {sum}");
    store.close().await;
    pool.close().await;
    Ok(())
}
