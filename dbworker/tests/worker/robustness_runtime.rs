//! Faults at run time must not burn a job's retries or hide its cause: failure
//! messages Postgres cannot store, a handler's transaction connection that dies
//! mid-job, and execution logs that grow without bound.

use crate::common;

use dbworker::{
    DEFAULT_MAX_NUM_RETRIES, DbJob, DbStore, Handling, MAX_FAILURE_MESSAGE_BYTES, StoreOptions,
    new_worker,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use workerutil::testing::{finished, wait_for};
use workerutil::{
    ExecutionLogEntry, Handler, HandlerError, JobContext, MAX_EXECUTION_LOG_ENTRIES, Outcome,
    Retry, WorkerOptions, error_chain,
};

use common::{Db, Job};

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.event_capacity = 16_384;
    o
}

async fn store(db: &Db, handling: Handling, max_num_retries: u32) -> Arc<DbStore<Job>> {
    let mut o = db.options();
    o.handling = handling;
    o.max_num_retries = max_num_retries;
    db.store_on(&db.table().await, o).await
}

async fn counters(db: &Db, id: i64) -> (i32, i32) {
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await;
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", id)
        .await;
    (failures, resets)
}

async fn failure_message(db: &Db, id: i64) -> Option<String> {
    db.scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await
}

async fn side_effects(db: &Db, id: i64) -> i64 {
    db.scalar("SELECT count(*) FROM side_effects WHERE job_id = $1", id)
        .await
}

// ---- Item 3: failure messages Postgres cannot store as they are ----

/// Logs an entry with a NUL byte, then fails for good with a 1 MB message
/// that contains NUL bytes.
#[derive(Default)]
struct NulFailure {
    runs: AtomicUsize,
}

const NUL_HEAD: &str = "bad input: \0 in field \0name";
impl Handler<DbStore<Job>> for NulFailure {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let entry = ExecutionLogEntry {
            key: "step\0one".into(),
            command: vec!["printf".into(), "a\\0b".into(), "\0".into()],
            out: "printed \0 here".into(),
            ..Default::default()
        };
        ctx.log(&entry).await.map_err(HandlerError::Retryable)?;
        let message = format!("{NUL_HEAD} {}", "x".repeat(1 << 20));
        Err(HandlerError::non_retryable(message))
    }
}

#[tokio::test]
async fn a_failure_message_with_nul_bytes_and_1mb_is_stored_sanitized_and_the_job_fails_once() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        let id = db.enqueue(1, json!({})).await[0];
        // Retries allowed: the error is non-retryable, so it must still fail once.
        let store = store(&db, handling, 3).await;
        let handler = Arc::new(NulFailure::default());
        let mut o = options("nul");
        o.num_total_jobs = Some(1);
        let worker = new_worker(store, handler.clone(), o).unwrap();
        let mut events = worker.subscribe();
        let run = tokio::spawn(worker.run());
        let (outcome, marked) = wait_for(&mut events, finished(id)).await;
        run.await.unwrap();

        assert!(
            matches!(outcome, Outcome::Failed(_)),
            "{handling:?}: {outcome:?}"
        );
        assert!(marked, "{handling:?}: the mark must take effect");
        assert_eq!(db.state(id).await, "failed", "{handling:?}");
        assert_eq!(
            handler.runs.load(Ordering::SeqCst),
            1,
            "{handling:?}: ran once"
        );
        assert_eq!(
            counters(&db, id).await,
            (1, 0),
            "{handling:?}: (failures, resets)"
        );
        let msg = failure_message(&db, id).await.expect("a message");
        assert!(
            msg.starts_with("bad input: \\0 in field \\0name xxx"),
            "{handling:?}: {}",
            &msg[..60]
        );
        assert!(msg.len() <= MAX_FAILURE_MESSAGE_BYTES, "{}", msg.len());
        let original = NUL_HEAD.len() + 1 + (1 << 20);
        assert!(
            msg.ends_with(&format!("… (truncated from {} bytes)", original + 2)),
            "{handling:?}: {}",
            &msg[msg.len() - 60..]
        );
        // The log entry with NUL bytes was stored too, with them made visible.
        let stored: serde_json::Value = db
            .scalar(
                "SELECT to_json(execution_logs[1]) FROM jobs WHERE id = $1",
                id,
            )
            .await;
        assert_eq!(stored["key"], "step\\0one", "{handling:?}");
        assert_eq!(stored["command"], json!(["printf", "a\\0b", "\\0"]));
        assert_eq!(stored["out"], "printed \\0 here");
    }
}

// ---- Item 4: the job's own transaction connection dies mid-job ----

/// First attempt: publishes its transaction's backend pid, waits to be
/// released (the test terminates that backend meanwhile), then writes through
/// `job.tx()` (or not) and returns. Later attempts write and complete.
struct LoseConnection {
    runs: AtomicUsize,
    pids: mpsc::UnboundedSender<i32>,
    release: Arc<Notify>,
    /// Whether the first attempt writes through `job.tx()` after the release
    /// (and so fails with `?`), or returns `Ok` without noticing.
    write_after_release: bool,
}

impl LoseConnection {
    fn new(write_after_release: bool) -> (Arc<Self>, mpsc::UnboundedReceiver<i32>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let handler = LoseConnection {
            runs: AtomicUsize::new(0),
            pids: tx,
            release: Arc::new(Notify::new()),
            write_after_release,
        };
        (Arc::new(handler), rx)
    }
}

async fn write_side_effect(job: &mut DbJob<Job>) -> Result<(), sqlx::Error> {
    let id = job.record().id;
    sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'in tx')")
        .bind(id)
        .execute(job.tx().expect("transactional handling"))
        .await?;
    Ok(())
}
impl Handler<DbStore<Job>> for LoseConnection {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        if self.runs.fetch_add(1, Ordering::SeqCst) > 0 {
            write_side_effect(job).await?;
            return Ok(());
        }
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(job.tx().expect("transactional handling"))
            .await?;
        self.pids.send(pid).expect("the test listens");
        self.release.notified().await;
        if self.write_after_release {
            // The connection is gone: `?` makes this a retryable handler error.
            write_side_effect(job).await?;
        }
        Ok(())
    }
}

/// Terminates the backend whose pid the handler publishes, then releases it.
async fn terminate_then_release(
    db: &Db,
    pids: &mut mpsc::UnboundedReceiver<i32>,
    h: &LoseConnection,
) {
    let pid = pids.recv().await.expect("the handler publishes its pid");
    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(done, "terminated the handler's backend");
    h.release.notify_one();
}

#[tokio::test]
async fn a_terminated_transaction_connection_requeues_the_job_without_counting_a_failure() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    // No retries: had the lost connection counted, the job would end failed.
    let store = store(&db, Handling::Transactional, 0).await;
    let (handler, mut pids) = LoseConnection::new(true);
    let mut o = options("lose");
    o.num_total_jobs = Some(2);
    let worker = new_worker(store, handler.clone(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    terminate_then_release(&db, &mut pids, &handler).await;

    let (outcome, marked) = wait_for(&mut events, finished(id)).await;
    assert!(matches!(outcome, Outcome::Errored(_)), "{outcome:?}");
    assert!(marked, "the store put the job back");
    // The worker claims it again and this time it completes.
    let (outcome, marked) = wait_for(&mut events, finished(id)).await;
    assert!(
        matches!(outcome, Outcome::Completed) && marked,
        "{outcome:?}"
    );
    run.await.unwrap();

    assert_eq!(db.state(id).await, "completed");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        counters(&db, id).await,
        (0, 1),
        "(failures, resets): a lost connection is a reset, not a failure"
    );
    assert_eq!(failure_message(&db, id).await, None);
    assert_eq!(
        side_effects(&db, id).await,
        1,
        "only the second attempt's write"
    );
}

#[tokio::test]
async fn a_completion_whose_transaction_connection_was_lost_requeues_the_job() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Transactional, 0).await;
    // The handler never notices: it returns Ok, and the completion cannot commit.
    let (handler, mut pids) = LoseConnection::new(false);
    let mut o = options("lose-complete");
    o.num_total_jobs = Some(1);
    let worker = new_worker(store, handler.clone(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    terminate_then_release(&db, &mut pids, &handler).await;
    let (outcome, marked) = wait_for(&mut events, finished(id)).await;
    run.await.unwrap();

    // Reported as what happened: not completed, put back to run again.
    assert!(matches!(outcome, Outcome::Interrupted), "{outcome:?}");
    assert!(marked, "the store put it back");
    assert_eq!(
        db.state(id).await,
        "queued",
        "back in the queue at once, not left to the resetter"
    );
    assert_eq!(counters(&db, id).await, (0, 1));
    let host: String = db
        .scalar("SELECT worker_hostname FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(host, "");
}

#[tokio::test]
async fn a_job_that_keeps_losing_its_connection_fails_after_max_num_resets() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut so = db.options();
    so.stall.max_num_resets = 0;
    let store = db.store_on(&db.table().await, so).await;
    let (handler, mut pids) = LoseConnection::new(true);
    let mut o = options("lose-often");
    o.num_total_jobs = Some(1);
    let worker = new_worker(store, handler.clone(), o).unwrap();
    let run = tokio::spawn(worker.run());
    terminate_then_release(&db, &mut pids, &handler).await;
    run.await.unwrap();

    assert_eq!(db.state(id).await, "failed");
    assert_eq!(counters(&db, id).await, (0, 0));
    let msg = failure_message(&db, id).await.unwrap();
    assert!(
        msg.starts_with(dbworker::DEFAULT_RESET_FAILURE_MESSAGE)
            && msg.contains("the job's database connection was lost: "),
        "{msg}"
    );
}

/// Fails inside its transaction on a healthy connection.
struct GenuineError;
impl Handler<DbStore<Job>> for GenuineError {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        write_side_effect(job).await?;
        sqlx::query("SELECT 1 / 0")
            .execute(job.tx().expect("transactional handling"))
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn a_genuine_database_error_in_the_handlers_transaction_still_counts() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Transactional, 0).await;
    let mut o = options("genuine");
    o.num_total_jobs = Some(1);
    new_worker(store, GenuineError, o).unwrap().run().await;

    assert_eq!(db.state(id).await, "failed", "no retries configured");
    assert_eq!(counters(&db, id).await, (1, 0));
    let msg = failure_message(&db, id).await.unwrap();
    assert!(msg.contains("division by zero"), "{msg}");
    assert_eq!(side_effects(&db, id).await, 0, "rolled back");
}

// ---- Item 13: execution logs are capped per attempt ----

/// Appends log entries until the store refuses, then completes.
#[derive(Default)]
struct Chatty {
    appended: AtomicUsize,
    refusal: std::sync::Mutex<Option<String>>,
}
impl Handler<DbStore<Job>> for Chatty {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        for i in 0..MAX_EXECUTION_LOG_ENTRIES + 10 {
            let entry = ExecutionLogEntry {
                key: format!("step.{i}"),
                out: "some output\n".repeat(4),
                ..Default::default()
            };
            match ctx.log(&entry).await {
                Ok(Some(_)) => {
                    self.appended.fetch_add(1, Ordering::SeqCst);
                }
                Ok(None) => return Err(HandlerError::retryable("lease lost")),
                Err(err) => {
                    let full = matches!(
                        err.downcast_ref::<workerutil::Error>(),
                        Some(workerutil::Error::ExecutionLogFull { .. })
                    );
                    assert!(full, "unexpected error: {err}");
                    *self.refusal.lock().unwrap() = Some(err.to_string());
                    break;
                }
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn appending_past_the_execution_log_cap_is_refused_and_stays_fast() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Heartbeat, 0).await;
    let handler = Arc::new(Chatty::default());
    let mut o = options("chatty");
    o.num_total_jobs = Some(1);
    let started = Instant::now();
    new_worker(store, handler.clone(), o).unwrap().run().await;
    let took = started.elapsed();

    assert_eq!(
        handler.appended.load(Ordering::SeqCst),
        MAX_EXECUTION_LOG_ENTRIES
    );
    let refusal = handler.refusal.lock().unwrap().clone().expect("refused");
    assert!(
        refusal.contains(&format!("execution log of job {id} is full"))
            && refusal.contains(&format!("at most {MAX_EXECUTION_LOG_ENTRIES} entries")),
        "{refusal}"
    );
    assert_eq!(db.state(id).await, "completed");
    assert_eq!(
        usize::try_from(db.log_len(id).await).unwrap(),
        MAX_EXECUTION_LOG_ENTRIES
    );
    // 10,000 uncapped appends took 114 s; the capped log stays cheap (generous
    // bound for a loaded CI machine).
    eprintln!("{MAX_EXECUTION_LOG_ENTRIES} appends and a refusal took {took:?}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

// ---- The default retry policy ----

/// Always fails with a retryable error.
struct Flaky;
impl Handler<DbStore<Job>> for Flaky {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Err(std::io::Error::other("upstream unavailable").into())
    }
}

#[tokio::test]
async fn by_default_a_retryable_error_is_retried_ten_times_with_backoff() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let defaults = StoreOptions::new("defaults");
    assert_eq!(defaults.max_num_retries, DEFAULT_MAX_NUM_RETRIES);
    assert_eq!(DEFAULT_MAX_NUM_RETRIES, 10);
    let store = db.store_on(&db.table().await, defaults).await;
    let run_once = || async {
        let mut o = options("defaults");
        o.num_total_jobs = Some(1);
        new_worker(store.clone(), Flaky, o).unwrap().run().await;
    };

    run_once().await;
    assert_eq!(
        db.state(id).await,
        "errored",
        "the first failure is retried"
    );
    assert_eq!(counters(&db, id).await, (1, 0));
    let delay: f64 = db
        .scalar(
            "SELECT EXTRACT(EPOCH FROM process_after - finished_at)::float8 FROM jobs WHERE id = $1",
            id,
        )
        .await;
    assert!(
        (8.9..=11.1).contains(&delay),
        "first retry after 10 s ± 10 %: {delay}"
    );

    // The eleventh attempt is the last.
    sqlx::query("UPDATE jobs SET num_failures = 10, process_after = now() WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    run_once().await;
    assert_eq!(db.state(id).await, "failed");
    assert_eq!(counters(&db, id).await, (11, 0));
}

// ---- A completion that fails on a healthy connection ----

/// Writes a child row whose parent does not exist, under a deferred foreign
/// key: the handler returns Ok (or, payload `"wait"`, waits for a signal),
/// and the COMMIT that ends its transaction fails.
struct DeferredViolation;
impl Handler<DbStore<Job>> for DeferredViolation {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO children (parent_id) VALUES (999)")
            .execute(job.tx().expect("transactional handling"))
            .await?;
        // Written with the completion, in its transaction.
        job.report_progress(_ctx.store(), json!({ "step": "last" }))?;
        if job.record().payload["wait"] == json!(true) {
            return Err(HandlerError::wait_for("go", Duration::from_secs(60)));
        }
        Ok(())
    }

    // The kind's policy, not the store's, decides: no retry.
    fn retry(&self, _record: &Job) -> Option<Retry> {
        Some(Retry::new().max_retries(0))
    }
}

#[tokio::test]
async fn a_completion_that_fails_at_commit_counts_as_a_failure_with_its_error() {
    // The completion's COMMIT, and a wait's (which commits the handler's
    // writes with the wait).
    for wait in [false, true] {
        let db = Db::new().await;
        db.add_columns(
            |c| c.progress = true,
            &[
                dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap(),
                "CREATE TABLE parents (id int PRIMARY KEY);
                 CREATE TABLE children (parent_id int NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)".into(),
            ],
        )
        .await;
        let id = db.enqueue(1, json!({ "wait": wait })).await[0];
        // The store would retry; the handler's own policy says no retries,
        // so the commit's error is final.
        let mut so = db.options();
        so.handling = Handling::Transactional;
        so.max_num_retries = 5;
        let table = db
            .table_with(|o| {
                o.signals = true;
                o.progress = true;
            })
            .await;
        let store = db.store_on(&table, so).await;
        let mut o = options("deferred");
        o.num_total_jobs = Some(1);
        let worker = new_worker(store, DeferredViolation, o).unwrap();
        let mut events = worker.subscribe();
        let run = tokio::spawn(worker.run());
        let (outcome, marked) = wait_for(&mut events, finished(id)).await;
        run.await.unwrap();

        // Reported as the error it is (to `post_handle` and the metrics
        // alike), with the errored mark written.
        match &outcome {
            Outcome::Errored(cause) => assert!(
                error_chain(cause.as_ref()).contains("foreign key"),
                "wait {wait}: {cause}"
            ),
            other => panic!("wait {wait}: reported {other:?}"),
        }
        assert!(marked, "wait {wait}: the errored mark was written");
        assert_eq!(
            db.state(id).await,
            "failed",
            "wait {wait}: not left processing"
        );
        assert_eq!(
            counters(&db, id).await,
            (1, 0),
            "wait {wait}: (failures, resets)"
        );
        let message = failure_message(&db, id).await.unwrap_or_default();
        assert!(message.contains("foreign key"), "wait {wait}: {message}");
        let children: i64 = db
            .scalar("SELECT count(*) FROM children WHERE parent_id = $1", 999)
            .await;
        assert_eq!(children, 0);
        // The last report, rolled back with the commit, written again with
        // the errored mark.
        let progress: serde_json::Value = db
            .scalar("SELECT progress FROM jobs WHERE id = $1", id)
            .await;
        assert_eq!(progress, json!({ "step": "last" }), "wait {wait}");
    }
}

/// Swallows a failed statement of its transaction, then waits: the wait's
/// own statements fail in the aborted transaction.
struct SwallowsThenWaits;
impl Handler<DbStore<Job>> for SwallowsThenWaits {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let _ = sqlx::query("SELECT 1 / 0")
            .execute(job.tx().expect("transactional handling"))
            .await;
        Err(HandlerError::wait_for("go", Duration::from_secs(60)))
    }
}

#[tokio::test]
async fn a_wait_whose_statement_fails_in_the_handlers_transaction_counts_as_a_failure() {
    let db = Db::new().await;
    db.add_columns(
        |_| {},
        &[dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap()],
    )
    .await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut so = db.options();
    so.handling = Handling::Transactional;
    so.max_num_retries = 0;
    let store = db
        .store_on(&db.table_with(|o| o.signals = true).await, so)
        .await;
    let (outcome, marked) = run_one(store, SwallowsThenWaits, "swallows", id).await;
    assert!(matches!(outcome, Outcome::Errored(_)), "{outcome:?}");
    assert!(marked);
    assert_eq!(db.state(id).await, "failed", "not left processing");
    let message = failure_message(&db, id).await.unwrap_or_default();
    assert!(message.contains("aborted"), "{message}");
}

/// Writes a row whose deferred trigger raises a serialization failure at
/// COMMIT the first time only (a sequence, which no rollback undoes).
struct ConflictOnce;
impl Handler<DbStore<Job>> for ConflictOnce {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO conflicts VALUES (1)")
            .execute(job.tx().expect("transactional handling"))
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn a_completion_that_conflicts_at_commit_is_put_back_counted_as_a_reset() {
    let db = conflicting_db().await;
    let id = db.enqueue(1, json!({})).await[0];
    // No retries: a conflict counted as a failure would fail the job.
    let store = store(&db, Handling::Transactional, 0).await;
    let mut o = options("conflict");
    o.num_total_jobs = Some(2);
    let worker = new_worker(store, ConflictOnce, o).unwrap();
    let mut events = worker.subscribe();
    tokio::time::timeout(Duration::from_secs(30), worker.run())
        .await
        .expect("the job ran twice");
    assert_eq!(db.state(id).await, "completed");
    assert_eq!(counters(&db, id).await, (0, 1), "(failures, resets)");
    // Reported as put back, then completed: not completed twice.
    let reported = common::finished_so_far(&mut events);
    assert_eq!(reported, [("interrupted", true), ("completed", true)]);
    let rows: i64 = db
        .scalar("SELECT count(*) FROM conflicts WHERE n = $1", 1)
        .await;
    assert_eq!(rows, 1, "the second attempt's write only");
}

/// Past the reset limit, the conflict at completion fails the job: reported
/// as an error with no retry left, not as completed.
#[tokio::test]
async fn a_completion_that_conflicts_past_the_reset_limit_is_reported_failed() {
    let db = conflicting_db().await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut so = db.options();
    so.handling = Handling::Transactional;
    so.stall.max_num_resets = 0;
    let store = db.store_on(&db.table().await, so).await;
    let (outcome, marked) = run_one(store, ConflictOnce, "conflict-last", id).await;
    assert!(matches!(outcome, Outcome::Errored(_)), "{outcome:?}");
    assert!(marked, "the store wrote its end");
    assert_eq!(db.state(id).await, "failed");
}

/// A table whose first insert into `conflicts` fails at COMMIT with a
/// serialization failure.
async fn conflicting_db() -> Db {
    let db = Db::new().await;
    db.execute(
        "CREATE SEQUENCE tries;
         CREATE TABLE conflicts (n int);
         CREATE FUNCTION conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF nextval('tries') = 1 THEN
             RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001';
           END IF;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER conflict_once AFTER INSERT ON conflicts
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION conflict_once()",
    )
    .await;
    db
}

/// Runs `handler` until job `id`, the only one, is recorded: what the
/// worker reported, and whether the store took it.
async fn run_one<H: Handler<DbStore<Job>>>(
    store: Arc<DbStore<Job>>,
    handler: H,
    name: &str,
    id: i64,
) -> (Outcome, bool) {
    let mut o = options(name);
    o.num_total_jobs = Some(1);
    let worker = new_worker(store, handler, o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let reported = wait_for(&mut events, finished(id)).await;
    run.await.unwrap();
    reported
}

/// Reports progress, then waits for a signal.
struct ReportsThenWaits;
impl Handler<DbStore<Job>> for ReportsThenWaits {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        job.report_progress(ctx.store(), json!({ "step": "before the wait" }))?;
        Err(HandlerError::wait_for("go", Duration::from_secs(60)))
    }
}

/// On a table without signals a transactional wait is a snooze, which rolls
/// the handler's transaction back: the last progress report is kept.
#[tokio::test]
async fn a_transactional_wait_without_signals_keeps_the_last_progress_report() {
    let db = Db::new().await;
    db.add_columns(|c| c.progress = true, &[]).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut so = db.options();
    so.handling = Handling::Transactional;
    let store = db
        .store_on(&db.table_with(|o| o.progress = true).await, so)
        .await;
    let (outcome, marked) = run_one(store, ReportsThenWaits, "snoozes", id).await;
    assert!(matches!(outcome, Outcome::Waiting { .. }), "{outcome:?}");
    assert!(marked);
    assert_eq!(db.state(id).await, "queued", "snoozed");
    let progress: serde_json::Value = db
        .scalar("SELECT progress FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(progress, json!({ "step": "before the wait" }));
}
