//! Transactional jobs stopped mid-query behind PgBouncer in transaction mode,
//! a pooler another program shares: every stuck job is handed back at once,
//! its server session ended, and neither the worker's pool nor the pooler's
//! server connections starve (a shutdown abandons every job at the same
//! moment), nor is a connection whose `BEGIN` waited in the pooler's queue
//! when its statement timed out handed back inside that transaction.
//! Skipped, saying why, without pgbouncer (.ci/run installs it).

use crate::common;
use crate::fixtures::stuck::{Stuck, released};

use dbworker::{DbJob, DbStore, Handling, JobTable, Pooler, new_worker};
use dbworker_testkit::pgbouncer::Bouncer;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use crate::POOLER;
use common::{Db, Job};

const HANDLERS: u32 = 3;

/// Completes at once.
struct Done;
impl Handler<DbStore<Job>> for Done {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = HANDLERS as usize;
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    // Well past the drain timeout: the stuck jobs hold every server
    // connection, so heartbeats fail from the start.
    o.heartbeat_failure_limit = Some(Duration::from_secs(4));
    o.drain_timeout = Duration::from_secs(1);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_stopped_mid_query_behind_a_shared_pgbouncer_are_handed_back_and_starve_nobody() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    // As many server connections as handlers: the stuck jobs hold them all.
    let Some(bouncer) = Bouncer::start_or_skip("the PgBouncer abandon test", db.db.url(), HANDLERS)
    else {
        return;
    };
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let pool = bouncer.pool(HANDLERS + 2).await;
    let other = bouncer.pool(2).await;
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Transactional;
    let store = Arc::new(DbStore::new(&pool, &table, so.clone()).await.unwrap());
    let ids = db.enqueue(HANDLERS as usize, json!({})).await;

    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    // No claim beyond the stuck jobs: a claim waiting in the pooler's queue
    // when the shutdown drops it would still land, as after a crash.
    let mut o = options("stuck");
    o.num_total_jobs = Some(HANDLERS as u64);
    let worker = new_worker(store, Stuck(started), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..HANDLERS {
        starts.recv().await.expect("every handler starts");
    }
    let since = Instant::now();
    shutdown.graceful();
    tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the shutdown waited for the stuck queries: {}",
                bouncer.log()
            )
        })
        .unwrap();
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    for id in &ids {
        assert_eq!(db.state(*id).await, "queued", "handed back, not charged");
    }
    assert!(
        released(&db, &ids).await,
        "the stuck server sessions were ended"
    );
    // Heartbeats timed out while their `BEGIN` waited in the pooler's queue:
    // no connection was handed back inside a transaction, where the marks
    // above would have been written and never committed.
    assert_eq!(
        db.sessions_in_transaction().await,
        0,
        "sessions left in a transaction"
    );

    // The other program and the next worker are served at once.
    let answered = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&other),
    )
    .await;
    assert!(matches!(answered, Ok(Ok(1))), "{answered:?}");
    let store = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let mut o = options("next");
    o.num_total_jobs = Some(HANDLERS as u64);
    tokio::time::timeout(
        Duration::from_secs(10),
        new_worker(store, Done, o).unwrap().run(),
    )
    .await
    .expect("the worker's pool serves the next worker");
    for id in &ids {
        assert_eq!(db.state(*id).await, "completed");
    }
}

/// Behind PgBouncer with its one server connection taken, a `BEGIN` waits
/// in the pooler's queue and its caller gives up. Once the server connection
/// is free, the next statement on the same client connection commits. With
/// sqlx 0.9.0 it ran inside the stray transaction and was never committed
/// (sqlx issue 4393): the floor of `sqlx` in Cargo.toml.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_whose_caller_gave_up_leaves_no_transaction_behind() {
    use sqlx::Connection;
    let db = Db::new().await;
    let Some(bouncer) = Bouncer::start_or_skip("the dropped BEGIN test", db.db.url(), 1) else {
        return;
    };
    // Not tested before it is handed out: the `BEGIN` is the first thing to
    // wait for the server connection (as on a connection acquired just
    // before the pooler's last server connection was taken).
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&bouncer.url())
        .await
        .unwrap();
    let mut holder = sqlx::PgConnection::connect(&bouncer.url()).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::raw_sql("SELECT 1").execute(&mut *held).await.unwrap();

    let gave_up = tokio::time::timeout(Duration::from_millis(300), pool.begin()).await;
    assert!(gave_up.is_err(), "the BEGIN waited in the pooler's queue");
    held.commit().await.unwrap();

    sqlx::raw_sql("INSERT INTO side_effects VALUES (1, 'after')")
        .execute(&pool)
        .await
        .unwrap();
    let seen: i64 = db
        .scalar("SELECT count(*) FROM side_effects WHERE job_id = $1", 1)
        .await;
    assert_eq!(seen, 1, "the insert committed");
}

/// Writes a row that breaks a deferred foreign key: the COMMIT fails.
struct BreaksAtCommit;
impl Handler<DbStore<Job>> for BreaksAtCommit {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO children (parent_id) VALUES (999)")
            .persistent(false)
            .execute(job.tx().expect("transactional handling"))
            .await?;
        Ok(())
    }

    // One retry, where the store would allow none.
    fn retry(&self, _record: &Job) -> Option<workerutil::Retry> {
        Some(workerutil::Retry::new().max_retries(1))
    }
}

/// Behind PgBouncer, a transactional completion whose COMMIT fails is
/// recorded and reported as the job's error, under the handler's retry
/// policy (errored, then failed at its retry limit), and no server session
/// is left inside a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_failing_at_commit_behind_pgbouncer_is_recorded_as_an_error() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    let Some(bouncer) = Bouncer::start_or_skip("the PgBouncer failed-commit test", db.db.url(), 2)
    else {
        return;
    };
    db.execute(
        "CREATE TABLE parents (id int PRIMARY KEY);
         CREATE TABLE children (parent_id int NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .await;
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let pool = bouncer.pool(4).await;
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Transactional;
    so.max_num_retries = 0;
    so.retry = dbworker::RetryPolicy::fixed(Duration::ZERO);
    let store = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let id = db.enqueue(1, json!({})).await[0];
    let mut o = options("breaks");
    o.num_handlers = 1;
    o.num_total_jobs = Some(2);
    let worker = new_worker(store, BreaksAtCommit, o).unwrap();
    let mut events = worker.subscribe();
    tokio::time::timeout(Duration::from_secs(20), worker.run())
        .await
        .unwrap_or_else(|_| panic!("the worker did not finish: {}", bouncer.log()));
    // Each attempt reported as the error it was, under the handler's policy.
    let reported = common::finished_so_far(&mut events);
    assert_eq!(reported, [("errored", true), ("errored", true)]);
    assert_eq!(db.state(id).await, "failed", "tried twice, failed twice");
    let (failures, message): (i32, String) =
        sqlx::query_as("SELECT num_failures, failure_message FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(failures, 2);
    assert!(message.contains("foreign key"), "{message}");
    let children: i64 = db
        .scalar("SELECT count(*) FROM children WHERE parent_id = $1", 999)
        .await;
    assert_eq!(children, 0, "nothing the handler wrote committed");
    assert_eq!(
        db.sessions_in_transaction().await,
        0,
        "sessions left in a transaction"
    );
}
