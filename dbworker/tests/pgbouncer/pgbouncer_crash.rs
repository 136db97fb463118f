//! Four worker processes through PgBouncer in transaction mode, killed with
//! SIGKILL mid-job: the resetter (also through PgBouncer) requeues what they
//! stranded and a new worker completes it. Transactional handling writes each
//! side effect in the job's transaction, so a killed job's write rolls back
//! with it: every job completes and every side effect is there exactly once.
//! Skipped, saying why, without pgbouncer (.ci/run installs it).

use crate::common;
use crate::fixtures::crash as shared;

use dbworker::{DbJob, DbStore, Handling, JobTable, Pooler, Resetter, ResetterOptions, new_worker};
use dbworker_testkit::pgbouncer as bouncer;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext};

use crate::POOLER;
use bouncer::Bouncer;
use common::{Db, Job};
use shared::options;

const CHILD_ENV: &str = "DBWORKER_PGBOUNCER_CRASH_CHILD_URL";
const PROCESSES: usize = 4;
const JOBS: usize = 600;
const STALLED_MAX_AGE: Duration = Duration::from_secs(2);

/// Writes the side effect in the job's transaction, then works a little, so
/// a kill finds jobs mid-way with their write not yet committed.
struct WritesInTx;
impl Handler<DbStore<Job>> for WritesInTx {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let tx = job.tx().expect("transactional handling");
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')")
            .bind(id)
            .persistent(false)
            .execute(tx)
            .await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(())
    }
}

async fn store(pool: &sqlx::PgPool) -> Arc<DbStore<Job>> {
    let mut so = Db::options_for_tests();
    so.handling = Handling::Transactional;
    so.stall.stalled_max_age = STALLED_MAX_AGE;
    let table = JobTable::new(pool, Db::table_options()).await.unwrap();
    Arc::new(DbStore::new(pool, &table, so).await.unwrap())
}

/// A worker process through PgBouncer, killed by the test below.
#[tokio::test]
#[ignore = "run as a child process by four_worker_processes_killed_through_pgbouncer_lose_and_repeat_nothing"]
async fn pgbouncer_crash_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect(&url)
        .await
        .unwrap();
    let mut o = options("doomed-behind-pgbouncer");
    o.num_handlers = 3;
    new_worker(store(&pool).await, WritesInTx, o)
        .unwrap()
        .run()
        .await;
}

fn spawn_child(url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            common::test_path(module_path!(), "pgbouncer_crash_child").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Server sessions of this database doing anything (a statement, or a
/// transaction left open) other than the asking one.
async fn busy_sessions(db: &Db) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_worker_processes_killed_through_pgbouncer_lose_and_repeat_nothing() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    let Some(bouncer) = Bouncer::start_or_skip("the PgBouncer crash test", db.db.url(), 20) else {
        return;
    };
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let ids = db.enqueue(JOBS, json!({})).await;
    let mut children: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn_child(&bouncer.url()))
        .collect();

    // Kill every process once jobs are completing and some are mid-way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (completed, processing): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'processing') FROM jobs",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if completed >= 100 && processing >= PROCESSES as i64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the children made no progress ({completed} completed): {}",
            bouncer.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for child in &mut children {
        child.kill().unwrap(); // SIGKILL
    }
    for child in &mut children {
        child.wait().unwrap();
    }
    // PgBouncer drops the server sessions its dead clients left in a
    // transaction (their writes roll back); a statement already sent runs to
    // its end. Count the stranded jobs once nothing is running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while busy_sessions(&db).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killed children's sessions never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stranded = db.count("processing").await;
    assert!(stranded > 0, "the kill left claimed jobs behind");
    let completed = db.count("completed").await;
    assert!(completed < JOBS as i64, "killed before the end");

    // The resetter through PgBouncer requeues exactly the stranded jobs.
    tokio::time::sleep(STALLED_MAX_AGE + Duration::from_millis(100)).await;
    let pool = bouncer.pool(10).await;
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = STALLED_MAX_AGE;
    let out = Resetter::new(&pool, &table, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len() as i64, stranded, "{out:?}");

    // A new worker through PgBouncer finishes the rest.
    let mut o = options("survivor");
    o.num_handlers = 4;
    o.num_total_jobs = Some(db.count("queued").await as u64);
    new_worker(store(&pool).await, WritesInTx, o)
        .unwrap()
        .run()
        .await;
    assert_eq!(db.count("completed").await, ids.len() as i64, "no job lost");
    let (never, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE n = 0), count(*) FILTER (WHERE n > 1)
         FROM (SELECT (SELECT count(*) FROM side_effects s WHERE s.job_id = j.id) AS n FROM jobs j) c",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((never, twice), (0, 0), "every side effect exactly once");
    println!(
        "{PROCESSES} processes killed after {completed} of {JOBS} jobs, {stranded} stranded and reset"
    );
}
