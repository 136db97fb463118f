//! A worker process killed with SIGKILL mid-job: the standalone resetter
//! (`dbworker reset`) requeues its job and another worker completes it.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dbworker::{DbJob, DbStore, Handling, Resetter, maintenance::ResetterOptions, new_worker};
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use common::{Db, Job};

const CHILD_ENV: &str = "DBWORKER_CRASH_CHILD_URL";
const BATCH_CHILD_ENV: &str = "DBWORKER_CRASH_BATCH_CHILD_URL";

struct Hang {
    pool: sqlx::PgPool,
    hang: bool,
}

#[async_trait]
impl Handler<DbStore<Job>> for Hang {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'started')")
            .bind(job.record().id)
            .execute(&self.pool)
            .await?;
        // The handler's own transactional write: lost with the process.
        let insert = sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'in tx')")
            .bind(job.record().id);
        insert.execute(job.tx().expect("transactional")).await?;
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(50);
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    o
}

/// The doomed worker. Does nothing unless spawned by the test below.
#[tokio::test]
#[ignore = "run as a child process by a_worker_killed_mid_job_has_its_job_requeued_and_completed"]
async fn crash_child_worker() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut so = Db::options_for_tests();
    so.stalled_max_age = Duration::from_secs(2);
    let store = std::sync::Arc::new(DbStore::new(pool.clone(), so).await.unwrap());
    new_worker(store, Hang { pool, hang: true }, options("doomed"))
        .unwrap()
        .run()
        .await;
}

#[tokio::test]
async fn a_worker_killed_mid_job_has_its_job_requeued_and_completed() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child_worker", "--ignored", "--nocapture"])
        .env(CHILD_ENV, db.db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db
        .scalar::<i64>("SELECT count(*) FROM side_effects WHERE job_id = $1", id)
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "the child never started the job");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(
        db.state(id).await,
        "processing",
        "nothing cleans up after SIGKILL"
    );

    // The standalone resetter, as an operator would run it.
    let resetter = env!("CARGO_BIN_EXE_dbworker");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(resetter)
            .args([
                "reset",
                "--table",
                "jobs",
                "--stalled-max-age-secs",
                "2",
                "--once",
            ])
            .env("DATABASE_URL", db.db.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.contains(&format!("reset {id} ")) {
            break;
        }
        assert!(stdout.starts_with("reset 0 job(s)"), "{stdout}");
        assert!(
            Instant::now() < deadline,
            "the resetter never requeued the job"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(db.state(id).await, "queued");
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(resets, 1);

    let store = db.store(Handling::Transactional).await;
    let mut o = options("survivor");
    o.num_total_jobs = Some(1);
    new_worker(
        store,
        Hang {
            pool: db.pool.clone(),
            hang: false,
        },
        o,
    )
    .unwrap()
    .run()
    .await;
    assert_eq!(db.state(id).await, "completed");
    let notes: Vec<String> =
        sqlx::query_scalar("SELECT note FROM side_effects WHERE job_id = $1 ORDER BY note")
            .bind(id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        notes,
        ["in tx", "started", "started"],
        "the killed attempt's transactional write was rolled back"
    );
}

/// Records each run of a job, then completes it (through the batched marks).
struct Note {
    pool: sqlx::PgPool,
}

#[async_trait]
impl Handler<DbStore<Job>> for Note {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')")
            .bind(job.record().id)
            .execute(&self.pool)
            .await?;
        // A little work per job, so the kill always finds jobs in flight
        // however fast the worker gets.
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

/// A heartbeat-handling worker with batched marks, killed by the test below.
#[tokio::test]
#[ignore = "run as a child process by a_worker_killed_with_marks_in_flight_loses_no_job"]
async fn crash_child_batch_worker() {
    let Ok(url) = std::env::var(BATCH_CHILD_ENV) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Heartbeat;
    so.stalled_max_age = Duration::from_secs(2);
    let store = std::sync::Arc::new(DbStore::new(pool.clone(), so).await.unwrap());
    let mut o = options("doomed-batch");
    o.num_handlers = 16;
    new_worker(store, Note { pool }, o).unwrap().run().await;
}

#[tokio::test]
async fn a_worker_killed_with_marks_in_flight_loses_no_job() {
    let db = Db::new().await;
    let ids = db.enqueue(3000, json!({})).await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_batch_worker",
            "--ignored",
            "--nocapture",
        ])
        .env(BATCH_CHILD_ENV, db.db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Kill it mid-stream, while jobs are running, buffered and being marked.
    while db.count("completed").await < 200 {
        assert!(Instant::now() < deadline, "the child made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let stranded = db.count("processing").await;
    assert!(stranded > 0, "the kill left claimed jobs behind");

    // Stalled jobs go back to the queue; a new worker finishes everything.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut ro = ResetterOptions::new("r", "jobs");
    ro.stalled_max_age = Duration::from_secs(2);
    let out = Resetter::new(db.pool.clone(), ro)
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len() as i64, stranded, "{out:?}");
    let store = db.store(Handling::Heartbeat).await;
    let mut o = options("survivor");
    o.num_handlers = 16;
    o.num_total_jobs = Some(db.count("queued").await as u64);
    new_worker(
        store,
        Note {
            pool: db.pool.clone(),
        },
        o,
    )
    .unwrap()
    .run()
    .await;
    assert_eq!(db.count("completed").await, ids.len() as i64, "no job lost");
    let never_ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM side_effects s WHERE s.job_id = j.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(never_ran, 0);
}
