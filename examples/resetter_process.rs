//! A worker process is killed with SIGKILL in the middle of a job; a resetter
//! running in its own process finds the job stalled and requeues it; a new
//! worker completes it.
//!
//! ```sh
//! cargo run --example resetter_process
//! ```
//!
//! The example runs itself three times: as the parent, as the doomed worker
//! (`worker URL`) and as the standalone resetter (`resetter URL`).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{
    DbJob, DbStore, JobTable, JobTableOptions, Resetter, ResetterOptions, Service, StallOptions,
    StoreOptions, new_worker,
};
use dbworker_testkit::TestDatabase;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

/// When a processing job counts as stalled: the workers' stores and the
/// standalone resetter must agree, so both take these.
fn stall() -> StallOptions {
    let mut stall = StallOptions::default();
    stall.stalled_max_age = Duration::from_secs(2);
    stall
}

/// The job table, described once in each process: its store or its resetter
/// takes it.
async fn table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    JobTable::new(pool, JobTableOptions::new("example_jobs j")).await
}

#[derive(Debug, sqlx::FromRow)]
struct ExampleJob {
    id: i64,
}

impl Record for ExampleJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Records that it started, then either hangs (the doomed worker) or finishes.
struct Work {
    pool: PgPool,
    hang: bool,
}
impl Handler<DbStore<ExampleJob>> for Work {
    async fn handle(
        &self,
        job: &mut DbJob<ExampleJob>,
        _ctx: &JobContext<DbStore<ExampleJob>>,
    ) -> Result<(), HandlerError> {
        // Autocommit, outside the job's transaction, so the parent can see it.
        sqlx::query("INSERT INTO attempts (job_id, pid) VALUES ($1, $2)")
            .bind(job.record().id)
            .bind(i64::from(std::process::id()))
            .persistent(false)
            .execute(&self.pool)
            .await?;
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

async fn store(pool: &PgPool) -> Result<Arc<DbStore<ExampleJob>>, dbworker::Error> {
    let table = table(pool).await?;
    let mut options = StoreOptions::new("crash_store");
    options.stall = stall();
    Ok(Arc::new(DbStore::new(pool, &table, options).await?))
}

fn worker_options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(50);
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    o
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => doomed_worker(&args[2]).await,
        Some("resetter") => standalone_resetter(&args[2]).await,
        _ => parent().await,
    }
}

async fn doomed_worker(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PgPool::connect(url).await?;
    let store = store(&pool).await?;
    let worker = new_worker(
        store,
        Work { pool, hang: true },
        worker_options("doomed_worker"),
    )?;
    worker.run().await;
    Ok(())
}

async fn standalone_resetter(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PgPool::connect(url).await?;
    let table = table(&pool).await?;
    let mut options = ResetterOptions::new("standalone_resetter");
    options.stall = stall();
    options.interval = Duration::from_millis(250);
    let resetter = Resetter::new(&pool, &table, options).await?;
    // Runs until it has brought a job back, so the example ends.
    let stop = CancellationToken::new();
    let done = stop.clone();
    let mut passes = resetter.subscribe();
    tokio::spawn(async move {
        while let Ok(out) = passes.recv().await {
            for (id, age) in &out.reset {
                println!(
                    "[resetter {}] requeued job {id}; its heartbeat was {:.1}s old",
                    std::process::id(),
                    age.as_secs_f64()
                );
                done.cancel();
            }
        }
    });
    resetter.run(stop).await?;
    pool.close().await;
    Ok(())
}

async fn parent() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    db.migrate(&sqlx::migrate!("./migrations")).await?;
    sqlx::raw_sql("CREATE TABLE attempts (job_id bigint NOT NULL, pid bigint NOT NULL); INSERT INTO example_jobs DEFAULT VALUES;")
        .execute(&pool)
        .await?;
    let me = std::env::current_exe()?;

    let mut doomed = Command::new(&me)
        .args(["worker", db.url()])
        .stdin(Stdio::null())
        .spawn()?;
    println!("[parent] started worker process {}", doomed.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM attempts")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the worker never started the job"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.kill()?; // SIGKILL: no chance to clean up.
    doomed.wait()?;
    let state: String = sqlx::query_scalar("SELECT state FROM example_jobs")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
    println!("[parent] killed it mid-job with SIGKILL; the job is left {state}");

    let status = Command::new(&me)
        .args(["resetter", db.url()])
        .stdin(Stdio::null())
        .status()?;
    assert!(status.success(), "resetter process failed");
    let (state, resets): (String, i32) =
        sqlx::query_as("SELECT state, num_resets FROM example_jobs")
            .persistent(false)
            .fetch_one(&mut *pool.begin().await?)
            .await?;
    println!("[parent] after the resetter: {state}, num_resets = {resets}");
    assert_eq!((state.as_str(), resets), ("queued", 1));

    let store = store(&pool).await?;
    let mut options = worker_options("second_worker");
    options.num_total_jobs = Some(1);
    new_worker(
        store,
        Work {
            pool: pool.clone(),
            hang: false,
        },
        options,
    )?
    .run()
    .await;
    let state: String = sqlx::query_scalar("SELECT state FROM example_jobs")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
    println!("[parent] a new worker finished it: {state} after {attempts} attempts");
    assert_eq!(state, "completed");
    pool.close().await;
    Ok(())
}
