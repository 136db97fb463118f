//! Transactional handling keeps each job's connection for the next job
//! (`store/open.rs`) instead of handing it back to the pool: the
//! transaction on it must still behave as sqlx's own (a handler's nested
//! `begin()` is a savepoint), and a kept connection that died while it waited
//! must cost the next job nothing. A job taken back by another session
//! before its open, or while it runs, commits nothing. A handler stopped
//! mid-query (its timeout, a shutdown's drain timeout) has its backend
//! terminated: the mark never waits for the query, nor the row lock for it.

use crate::common;

use dbworker::{DbJob, DbStore, Handling, new_worker};
use serde_json::json;
use sqlx::Connection;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workerutil::{Handler, HandlerError, JobContext, Store, WorkerOptions};

use crate::fixtures::stuck::{Stuck, released};
use common::{Db, Job};

/// Commits a nested transaction holding a write, then fails the job when its
/// payload says so; also notes the backend its transaction runs on.
struct Nested;
impl Handler<DbStore<Job>> for Nested {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let fail = job.record().payload["fail"] == json!(true);
        let tx = job.tx().expect("transactional handling");
        let mut inner = tx.begin().await?;
        sqlx::query("INSERT INTO side_effects (job_id, note) SELECT $1, pg_backend_pid()::text")
            .bind(id)
            .execute(&mut *inner)
            .await?;
        inner.commit().await?;
        if fail {
            return Err(HandlerError::non_retryable("told to fail"));
        }
        Ok(())
    }
}

fn one_job(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = 1;
    o.num_total_jobs = Some(1);
    o.interval = Duration::from_millis(10);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    o
}

async fn run_one(store: &Arc<DbStore<Job>>) {
    new_worker(store.clone(), Nested, one_job("one"))
        .unwrap()
        .run()
        .await;
}

async fn backend_of(db: &Db, id: i64) -> Option<i32> {
    let pid: Option<String> = sqlx::query_scalar("SELECT note FROM side_effects WHERE job_id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap();
    pid.map(|p| p.parse().unwrap())
}

#[tokio::test]
async fn a_nested_commit_in_a_handler_is_a_savepoint_of_the_jobs_transaction() {
    let db = Db::new().await;
    let store = db.store(Handling::Transactional).await;
    let ok = db.enqueue(1, json!({})).await[0];
    run_one(&store).await;
    let failing = db.enqueue(1, json!({"fail": true})).await[0];
    run_one(&store).await;
    assert_eq!(db.state(ok).await, "completed");
    assert!(
        backend_of(&db, ok).await.is_some(),
        "the nested write committed with the job"
    );
    assert_eq!(db.state(failing).await, "failed");
    assert_eq!(
        backend_of(&db, failing).await,
        None,
        "the nested commit released a savepoint, not the job's transaction: the failure rolled it back"
    );
}

#[tokio::test]
async fn a_kept_connection_that_died_while_it_waited_costs_the_next_job_nothing() {
    let db = Db::new().await;
    let store = db.store(Handling::Transactional).await;
    let first = db.enqueue(1, json!({})).await[0];
    run_one(&store).await;
    let pid = backend_of(&db, first).await.expect("the first job ran");
    let second = db.enqueue(1, json!({})).await[0];
    // Its connection is kept for the next job (for 100 ms): end its backend
    // meanwhile.
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(killed);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        if !alive {
            break;
        }
        assert!(Instant::now() < deadline, "backend {pid} never ended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run_one(&store).await;
    assert_eq!(db.state(second).await, "completed");
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", second)
        .await;
    assert_eq!(
        resets, 0,
        "the dead connection was replaced before the job began"
    );
    assert_ne!(backend_of(&db, second).await, Some(pid));
}

/// Kept connections are counted in the pool, and `PgPool::close` waits for
/// every connection: a worker that has finished must not hold it up (the
/// sweeper hands them back within 100 ms), though its store is still alive.
#[tokio::test]
async fn closing_the_pool_after_a_worker_finished_does_not_wait_for_kept_connections() {
    let db = Db::new().await;
    let pool = db.db.pool(6).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Transactional;
    let store = Arc::new(DbStore::new(&pool, &db.table().await, so).await.unwrap());
    db.enqueue(3, json!({})).await;
    let mut o = one_job("closing");
    o.num_total_jobs = Some(3);
    new_worker(store.clone(), Nested, o).unwrap().run().await;
    assert_eq!(db.count("completed").await, 3);
    tokio::time::timeout(Duration::from_secs(5), pool.close())
        .await
        .expect("the pool closed while the store still lived");
    drop(store);
}

/// Claims the next queued job through the store's own calls.
async fn claim(store: &DbStore<Job>) -> DbJob<Job> {
    store
        .dequeue("host", &Default::default(), 1)
        .await
        .unwrap()
        .pop()
        .expect("a queued job")
}

/// How another session takes a claimed job back. Hand-written SQL: the
/// documented requeue and completion (`Admin`, the CLI) refuse a processing
/// row, and the resetter skips one a live transaction locks; a transactional
/// handler's `FOR KEY SHARE` blocks neither write.
const REQUEUED: &str = "UPDATE jobs SET state = 'queued', started_at = NULL WHERE id = $1";
const COMPLETED: &str = "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1";

/// A transactional job taken back by another session commits nothing. Before
/// its open: it is not opened (its lock finds no row with its token). While
/// it runs: its fenced mark changes nothing and the store rolls back instead
/// of committing, so the handler's write is gone; taken back as a requeue,
/// or completed by hand (the row `completed` under this very token). The
/// other session's write stands, and the jobs left run on the kept
/// connections, their writes landing with their completions.
#[tokio::test]
async fn a_job_taken_back_by_another_session_commits_nothing() {
    let db = Db::new().await;
    let store = db.store(Handling::Transactional).await;
    // One job first, so the opens below take a kept connection.
    let first = db.enqueue(1, json!({})).await[0];
    run_one(&store).await;
    assert!(backend_of(&db, first).await.is_some());
    for (how, take_back, opened, left) in [
        (
            "completed by hand while it ran",
            COMPLETED,
            true,
            "completed",
        ),
        ("requeued before its open", REQUEUED, false, "queued"),
        ("requeued while it ran", REQUEUED, true, "queued"),
    ] {
        db.enqueue(1, json!({})).await;
        let mut job = claim(&store).await;
        let taken = job.record().id;
        if opened {
            assert!(store.open(&mut job).await.unwrap());
            let tx = job.tx().expect("transactional handling");
            sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'stale attempt')")
                .bind(taken)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        let pool = &db.pool;
        sqlx::query(take_back)
            .bind(taken)
            .execute(pool)
            .await
            .unwrap();
        if opened {
            assert!(
                !store.mark_complete(&mut job).await.unwrap(),
                "{how}: the completion of a lost claim is refused"
            );
        } else {
            assert!(
                !store.open(&mut job).await.unwrap(),
                "{how}: a job whose claim was lost is not opened"
            );
            assert!(job.tx().is_none());
        }
        assert_eq!(db.state(taken).await, left, "{how}: the other write stands");
        assert_eq!(
            backend_of(&db, taken).await,
            None,
            "{how}: the stale attempt's write was rolled back with its mark"
        );
    }
    // The jobs taken back to the queue run again, on kept connections, and
    // this time their writes land with their completions.
    while db.count("queued").await > 0 {
        run_one(&store).await;
    }
    let ran: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs WHERE id > $1")
        .bind(first)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    for id in ran {
        assert_eq!(db.state(id).await, "completed");
    }
}

// ---- A handler dropped mid-query (its timeout, a shutdown) ----

#[tokio::test]
async fn a_transactional_handler_timed_out_mid_query_is_marked_at_once_and_its_lock_released() {
    // (payload, retries, state): a final timeout fails, one with retries left errs.
    // "report": with progress pending when it stops, written before the mark;
    // "own": the handler drops its own query and returns (no timeout of the
    // worker's): the rollback that would wait for that query is given up.
    for (wait, retries, state) in [
        ("sleep", 0, "failed"),
        ("lock", 3, "errored"),
        ("report", 0, "failed"),
        ("own", 0, "failed"),
    ] {
        let db = Db::new().await;
        db.add_columns(|c| c.progress = true, &[]).await;
        let mut blocker = db.pool.begin().await.unwrap();
        sqlx::query("INSERT INTO side_effects VALUES (0, 'held')")
            .execute(&db.pool)
            .await
            .unwrap();
        sqlx::query("SELECT * FROM side_effects WHERE job_id = 0 FOR UPDATE")
            .execute(&mut *blocker)
            .await
            .unwrap();
        let mut so = db.options();
        so.handling = Handling::Transactional;
        so.max_num_retries = retries;
        let table = db.table_with(|o| o.progress = true).await;
        let store = db.store_on(&table, so).await;
        let payload = json!({ "wait": wait, "report": wait == "report" });
        let id = db.enqueue(1, payload).await[0];
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let mut o = one_job(wait);
        o.max_runtime_per_job = Some(Duration::from_secs(1));
        let worker = new_worker(store, Stuck(started), o).unwrap();
        let run = tokio::spawn(worker.run());
        starts.recv().await.expect("the handler starts");
        let since = Instant::now();
        tokio::time::timeout(Duration::from_secs(8), run)
            .await
            .unwrap_or_else(|_| panic!("{wait}: the timed-out job's mark waited for its query"))
            .unwrap();
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{wait}: {:?}",
            since.elapsed()
        );
        assert_eq!(db.state(id).await, state, "{wait}");
        assert!(
            released(&db, &[id]).await,
            "{wait}: the query was ended and the job's row lock is gone"
        );
        if wait == "report" {
            let progress: serde_json::Value = db
                .scalar("SELECT progress FROM jobs WHERE id = $1", id)
                .await;
            assert_eq!(progress, json!({ "step": 2 }), "the last report kept");
        }
        blocker.rollback().await.unwrap();
    }
}

#[tokio::test]
async fn a_graceful_shutdown_past_its_drain_timeout_does_not_wait_for_a_stuck_query() {
    let db = Db::new().await;
    let store = db.store(Handling::Transactional).await;
    let id = db.enqueue(1, json!({})).await[0];
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let mut o = one_job("drain");
    o.drain_timeout = Duration::from_secs(1);
    let worker = new_worker(store, Stuck(started), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    starts.recv().await.expect("the handler starts");
    let since = Instant::now();
    shutdown.graceful();
    tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .expect("the shutdown waited for the handler's query")
        .unwrap();
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    assert_eq!(db.state(id).await, "queued", "handed back, not charged");
    assert!(released(&db, &[id]).await);
}

/// Every job of a worker whose pool has no spare connection is abandoned at
/// once (a shutdown's drain timeout): none may wait for a second connection
/// while it holds its own, or the pool starves (behind a transaction pooler
/// the worker lost its heartbeats for good). The pool then serves the next
/// worker, its size intact.
#[tokio::test]
async fn jobs_abandoned_all_at_once_on_a_full_pool_are_handed_back_and_the_pool_lives_on() {
    const N: u32 = 3;
    let db = Db::new().await;
    // One connection per handler and two for claims and heartbeats (the
    // smallest pool `new_worker` accepts).
    let pool = db.db.pool(N + 2).await.unwrap();
    let mut so = db.options();
    so.handling = Handling::Transactional;
    let table = db.table().await;
    let store = Arc::new(DbStore::new(&pool, &table, so.clone()).await.unwrap());
    let ids = db.enqueue(N as usize, json!({})).await;
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let mut o = one_job("full_pool");
    o.num_handlers = N as usize;
    o.num_total_jobs = None;
    o.drain_timeout = Duration::from_secs(1);
    let worker = new_worker(store, Stuck(started), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..N {
        starts.recv().await.expect("every handler starts");
    }
    // Hold the pool's spare connections until the end, as busy claims and
    // heartbeats would.
    let held = [pool.acquire().await.unwrap(), pool.acquire().await.unwrap()];
    shutdown.graceful();
    tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .expect("the abandoned jobs starved the pool")
        .unwrap();
    drop(held);
    for id in &ids {
        assert_eq!(db.state(*id).await, "queued", "handed back, not charged");
    }
    assert!(released(&db, &ids).await);

    let store = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let mut o = one_job("after");
    o.num_handlers = N as usize;
    o.num_total_jobs = Some(N as u64);
    let next = new_worker(store, Nested, o).unwrap().run();
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the pool serves the next worker");
    for id in &ids {
        assert_eq!(db.state(*id).await, "completed");
    }
}

/// With `track_activities` off an abandoned transaction's backend cannot be
/// named (its start is not reported), so it is not terminated: the guide's
/// limit. The job is still marked at once, its connection closed, and the
/// pool serves the next statement; only the query runs on.
#[tokio::test]
async fn with_track_activities_off_a_job_stopped_mid_query_is_still_marked_at_once() {
    let db = Db::new().await;
    db.execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_activities = off', current_database()); END $$",
    )
    .await;
    // Sessions opened from now on do not report their activity.
    let pool = db.db.pool(8).await.unwrap();
    let off: String = sqlx::query_scalar("SHOW track_activities")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(off, "off");
    let mut so = db.options();
    so.handling = Handling::Transactional;
    let store = Arc::new(DbStore::new(&pool, &db.table().await, so).await.unwrap());
    let id = db.enqueue(1, json!({})).await[0];
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let mut o = one_job("untracked");
    o.max_runtime_per_job = Some(Duration::from_secs(1));
    let run = tokio::spawn(new_worker(store, Stuck(started), o).unwrap().run());
    starts.recv().await.expect("the handler starts");
    let since = Instant::now();
    tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .expect("the mark waited for the query")
        .unwrap();
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    assert_eq!(db.state(id).await, "failed");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}
