//! A worker process killed with SIGKILL mid-job: the standalone resetter
//! (`dbworker reset`) requeues its job and another worker completes it.

use crate::common;
use crate::fixtures::crash as shared;

use dbworker::{DbJob, DbStore, Handling, JobTable, new_worker};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use workerutil::{Handler, HandlerError, JobContext};

use common::{Db, Job};
use shared::options;

const CHILD_ENV: &str = "DBWORKER_CRASH_CHILD_URL";

struct Hang {
    pool: sqlx::PgPool,
    hang: bool,
}
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

/// The doomed worker. Does nothing unless spawned by the test below.
#[tokio::test]
#[ignore = "run as a child process by a_worker_killed_mid_job_has_its_job_requeued_and_completed"]
async fn crash_child_worker() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut so = Db::options_for_tests();
    so.stall.stalled_max_age = Duration::from_secs(2);
    let store = std::sync::Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    new_worker(store, Hang { pool, hang: true }, options("doomed"))
        .unwrap()
        .run()
        .await;
}

#[tokio::test]
async fn a_worker_killed_mid_job_has_its_job_requeued_and_completed() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    kill_mid_job_and_recover(&db, id).await;
}

/// The same on a table partitioned by day, the job in last week's partition.
#[tokio::test]
async fn a_worker_killed_mid_job_on_a_partitioned_table_has_its_job_requeued_and_completed() {
    let db = Db::partitioned().await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (queued_at) VALUES (now() - interval '5 days') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let partition: String = db
        .scalar(
            "SELECT tableoid::regclass::text FROM jobs WHERE id = $1",
            id,
        )
        .await;
    assert!(
        partition.starts_with("jobs_p"),
        "in a dated partition: {partition}"
    );
    kill_mid_job_and_recover(&db, id).await;
}

/// Starts a transactional worker as a child process, kills it mid-job, runs
/// `dbworker reset` until the job is requeued and completes it with a new worker.
async fn kill_mid_job_and_recover(db: &Db, id: i64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            common::test_path(module_path!(), "crash_child_worker").as_str(),
            "--ignored",
            "--nocapture",
        ])
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
