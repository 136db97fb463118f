//! The Postgres store under real workers: transactional handling, fencing,
//! cancellation, retries, bad rows, the resetter and many workers at once.

use crate::common;

use dbworker::{
    DbConditions, DbJob, DbStore, Error, Handling, JobTable, JobTableOptions, Resetter,
    ResetterOptions, StoreOptions, new_worker,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use workerutil::testing::{finished, wait_for};
use workerutil::{
    BoxError, ExecutionLogEntry, Handler, HandlerError, JobContext, Outcome, StopReason, Store,
    Worker, WorkerEvent, WorkerOptions,
};

use common::{Db, Job};

/// Acts on each job as its payload says.
#[derive(Default)]
struct Script {
    pool: Option<sqlx::PgPool>,
    release: Arc<Notify>,
    max_cost: Option<i32>,
}
impl Handler<DbStore<Job>> for Script {
    async fn pre_dequeue(&self) -> Result<Option<DbConditions>, BoxError> {
        Ok(Some(match self.max_cost {
            Some(max) => DbConditions::new().and_sql("j.cost <= $1", [max]),
            None => DbConditions::new(),
        }))
    }

    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let act = job.record().payload["act"]
            .as_str()
            .unwrap_or("ok")
            .to_owned();
        if act == "wait" || act == "wait_then_write" {
            self.release.notified().await;
        }
        if act == "forever" {
            std::future::pending::<()>().await;
        }
        if act.contains("write") {
            let insert =
                sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'written')")
                    .bind(id);
            match job.tx() {
                Some(tx) => insert.execute(tx).await?,
                None => insert.execute(self.pool.as_ref().expect("pool")).await?,
            };
            let entry = ExecutionLogEntry {
                key: "write".into(),
                ..Default::default()
            };
            ctx.log(&entry).await.map_err(HandlerError::Retryable)?;
        }
        match act.as_str() {
            "fail" | "write_then_fail" => Err(std::io::Error::other("flaky upstream").into()),
            "poison" => Err(HandlerError::non_retryable("malformed payload")),
            "panic" => panic!("handler bug"),
            _ => Ok(()),
        }
    }
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.event_capacity = 16_384;
    o
}

async fn side_effects(db: &Db, id: i64) -> i64 {
    db.scalar("SELECT count(*) FROM side_effects WHERE job_id = $1", id)
        .await
}

#[tokio::test]
async fn smoke_connects_through_sqlx() {
    let db = Db::new().await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

#[tokio::test]
async fn handler_writes_commit_with_completion_and_roll_back_on_error() {
    let db = Db::new().await;
    let ok = db.enqueue(1, json!({"act": "write"})).await[0];
    let bad = db.enqueue(1, json!({"act": "write_then_fail"})).await[0];
    let store = db.store(Handling::Transactional).await;
    let mut o = options("tx");
    o.num_total_jobs = Some(2);
    new_worker(store, Script::default(), o).unwrap().run().await;

    assert_eq!(db.state(ok).await, "completed");
    assert_eq!(
        side_effects(&db, ok).await,
        1,
        "a completed job's writes commit"
    );
    assert_eq!(db.state(bad).await, "failed", "no retries configured");
    assert_eq!(
        side_effects(&db, bad).await,
        0,
        "a failed job's writes are rolled back"
    );
    let msg: Option<String> = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", bad)
        .await;
    assert_eq!(msg.as_deref(), Some("flaky upstream"));
    // The execution log is written outside the handler's transaction: it survives.
    let logs = db.log_len(bad).await;
    assert_eq!(logs, 1);
}

#[tokio::test]
async fn retries_then_failure() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({"act": "fail"})).await[0];
    let mut so = db.options();
    so.max_num_retries = 2;
    // A long delay keeps each errored state observable; the test makes it due.
    so.retry = dbworker::RetryPolicy::fixed(Duration::from_secs(3600));
    let store = db.store_on(&db.table().await, so).await;
    let worker = new_worker(store, Script::default(), {
        let mut o = options("retry");
        o.num_total_jobs = Some(3);
        o
    })
    .unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    for expected in ["errored", "errored", "failed"] {
        let (outcome, marked) = wait_for(&mut events, finished(id)).await;
        assert!(matches!(outcome, Outcome::Errored(_)) && marked);
        assert_eq!(db.state(id).await, expected);
        if expected == "errored" {
            let delay: f64 = db.scalar("SELECT EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1", id).await;
            assert!(delay > 3500.0, "the retry waits its delay: {delay}");
            sqlx::query("UPDATE jobs SET process_after = now() WHERE id = $1")
                .bind(id)
                .execute(&db.pool)
                .await
                .unwrap();
        }
    }
    run.await.unwrap();
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(failures, 3);
}

#[tokio::test]
async fn retry_delay_comes_from_the_database_clock_with_backoff() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({"act": "fail"})).await[0];
    let mut so = db.options();
    so.max_num_retries = 5;
    so.retry = dbworker::RetryPolicy {
        retry_after: Duration::from_secs(100),
        backoff_factor: 3.0,
        max_delay: Duration::from_secs(250),
        jitter: 0.0,
    };
    let store = db.store_on(&db.table().await, so).await;
    let expected = [100.0, 250.0];
    for (attempt, want) in expected.iter().enumerate() {
        // Make it due again, then fail it once more.
        sqlx::query("UPDATE jobs SET process_after = NULL")
            .execute(&db.pool)
            .await
            .unwrap();
        let worker = new_worker(store.clone(), Script::default(), {
            let mut o = options("b");
            o.num_total_jobs = Some(1);
            o
        })
        .unwrap();
        worker.run().await;
        let delay: f64 = db.scalar("SELECT EXTRACT(EPOCH FROM process_after - finished_at)::float8 FROM jobs WHERE id = $1", id).await;
        assert!(
            (delay - want).abs() < 0.5,
            "attempt {attempt}: delay {delay}, want {want}"
        );
        assert_eq!(db.state(id).await, "errored");
    }
}

#[tokio::test]
async fn poison_and_panics_fail_the_job_and_the_worker_goes_on() {
    let db = Db::new().await;
    let poison = db.enqueue(1, json!({"act": "poison"})).await[0];
    let panics = db.enqueue(1, json!({"act": "panic"})).await[0];
    let fine = db.enqueue(1, json!({"act": "ok"})).await[0];
    let mut so = db.options();
    so.max_num_retries = 3;
    so.retry = dbworker::RetryPolicy::fixed(Duration::from_secs(3600));
    let store = db.store_on(&db.table().await, so).await;
    let mut o = options("p");
    o.num_total_jobs = Some(3);
    new_worker(store, Script::default(), o).unwrap().run().await;
    assert_eq!(
        db.state(poison).await,
        "failed",
        "a poison error is not retried"
    );
    assert_eq!(
        db.state(panics).await,
        "errored",
        "a panic is a retryable error"
    );
    let msg: Option<String> = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", panics)
        .await;
    assert_eq!(msg.as_deref(), Some("handler panicked: handler bug"));
    assert_eq!(db.state(fine).await, "completed");
}

#[tokio::test]
async fn a_row_that_fails_to_scan_is_failed_with_the_reason_and_the_worker_goes_on() {
    let db = Db::new().await;
    let bad = db.enqueue(1, json!({"act": "ok"})).await[0];
    let good = db.enqueue(1, json!({"act": "ok"})).await[0];
    // `cost` as text: the FromRow scan of an integer field fails for that row only.
    let table = db
        .table_with(|t| {
            t.column_expressions = vec![
                "j.id".into(),
                "j.payload".into(),
                format!("CASE WHEN j.id = {bad} THEN NULL ELSE j.cost END AS cost"),
            ]
        })
        .await;
    let store = db.store_on(&table, db.options()).await;
    let mut o = options("scan");
    o.num_total_jobs = Some(1);
    o.num_handlers = 2;
    new_worker(store, Script::default(), o).unwrap().run().await;
    assert_eq!(db.state(bad).await, "failed");
    let msg: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", bad)
        .await;
    assert!(
        msg.starts_with(&format!("failed to scan record {bad}: ")) && msg.contains("cost"),
        "{msg}"
    );
    assert_eq!(db.state(good).await, "completed");
}

#[tokio::test]
async fn the_cancel_flag_cancels_a_running_handler_within_a_heartbeat() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        let id = db.enqueue(1, json!({"act": "forever"})).await[0];
        let store = db.store(handling).await;
        let mut o = options("cancel");
        o.num_total_jobs = Some(1);
        let worker = new_worker(store, Script::default(), o).unwrap();
        let mut events = worker.subscribe();
        let run = tokio::spawn(worker.run());
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
        })
        .await;
        let asked = std::time::Instant::now();
        // An operator's UPDATE is not blocked by the handler's row lock.
        tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::query("UPDATE jobs SET cancel = true WHERE id = $1")
                .bind(id)
                .execute(&db.pool),
        )
        .await
        .expect("setting cancel must not block on the handler's lock")
        .unwrap();
        let (outcome, marked) = wait_for(&mut events, finished(id)).await;
        assert!(
            matches!(outcome, Outcome::Canceled),
            "{handling:?}: {outcome:?}"
        );
        assert!(marked);
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{handling:?}: took {:?}",
            asked.elapsed()
        );
        run.await.unwrap();
        assert_eq!(db.state(id).await, "canceled", "{handling:?}");
    }
}

#[tokio::test]
async fn heartbeats_keep_a_long_transactional_job_alive_and_the_resetter_skips_it() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({"act": "wait"})).await[0];
    let store = db.store(Handling::Transactional).await;
    let handler = Script::default();
    let release = handler.release.clone();
    let mut o = options("alive");
    o.num_total_jobs = Some(1);
    let worker = new_worker(store.clone(), handler, o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
    })
    .await;
    // Two heartbeat rounds go through despite the handler's row lock.
    for _ in 0..2 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Heartbeat { .. }).then_some(())
        })
        .await;
    }
    let fresh: bool = db
        .scalar(
            "SELECT last_heartbeat_at > now() - interval '1 second' FROM jobs WHERE id = $1",
            id,
        )
        .await;
    assert!(
        fresh,
        "heartbeats update the row while its handler holds the lock"
    );
    // Even with a stale heartbeat, a row locked by a live handler is not stalled.
    db.age_heartbeats().await;
    let out = store.reset_stalled().await.unwrap();
    assert!(out.reset.is_empty() && out.failed.is_empty(), "{out:?}");
    release.notify_one();
    let (outcome, marked) = wait_for(&mut events, finished(id)).await;
    assert!(matches!(outcome, Outcome::Completed) && marked);
    run.await.unwrap();
}

#[tokio::test]
async fn a_paused_worker_whose_job_was_reset_and_reclaimed_cannot_write() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({"act": "wait_then_write"})).await[0];
    let store = db.store(Handling::Heartbeat).await;

    // Worker A claims the job, then "pauses": its heartbeats stop (an hour apart)
    // and its handler waits to be released.
    let a_handler = Script {
        pool: Some(db.pool.clone()),
        ..Default::default()
    };
    let release_a = a_handler.release.clone();
    let mut ao = options("worker-a");
    ao.hostname = Some("host-a".into());
    ao.heartbeat_interval = Duration::from_secs(3600);
    ao.heartbeat_failure_limit = Some(Duration::from_secs(3600));
    ao.num_total_jobs = Some(1);
    // Such slow heartbeats only fit a store that tolerates them (the store
    // checks every worker's options); the resetter below uses the 5 s one.
    let mut slow = db.options();
    slow.handling = Handling::Heartbeat;
    slow.stall.stalled_max_age = Duration::from_secs(5 * 3600);
    let store_a = db.store_on(&db.table().await, slow).await;
    let a = Worker::new(store_a, a_handler, ao).unwrap();
    let mut a_events = a.subscribe();
    let a_run = tokio::spawn(a.run());
    wait_for(&mut a_events, |e| {
        matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
    })
    .await;

    // The resetter finds it stalled and requeues it; worker B takes it and finishes.
    db.age_heartbeats().await;
    let out = store.reset_stalled().await.unwrap();
    assert_eq!(out.reset.iter().map(|r| r.0).collect::<Vec<_>>(), vec![id]);
    let b_handler = Script {
        pool: Some(db.pool.clone()),
        ..Default::default()
    };
    let release_b = b_handler.release.clone();
    let mut bo = options("worker-b");
    bo.hostname = Some("host-b".into());
    bo.num_total_jobs = Some(1);
    let b = new_worker(store.clone(), b_handler, bo).unwrap();
    let mut b_events = b.subscribe();
    let b_run = tokio::spawn(b.run());
    wait_for(&mut b_events, |e| {
        matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
    })
    .await;

    // A wakes up while B owns the job: every write of A's is refused.
    release_a.notify_one();
    let (outcome, marked) = wait_for(&mut a_events, finished(id)).await;
    assert!(matches!(outcome, Outcome::Completed), "{outcome:?}");
    assert!(!marked, "the stale worker's completion must be refused");
    a_run.await.unwrap();
    assert_eq!(db.state(id).await, "processing", "B still owns it");
    let host: String = db
        .scalar("SELECT worker_hostname FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(host, "host-b");
    let logs = db.log_len(id).await;
    assert_eq!(logs, 0, "the stale worker's log entry must be refused");

    release_b.notify_one();
    let (outcome, marked) = wait_for(&mut b_events, finished(id)).await;
    assert!(matches!(outcome, Outcome::Completed) && marked);
    b_run.await.unwrap();
    assert_eq!(db.state(id).await, "completed");
    let logs = db.log_len(id).await;
    assert_eq!(logs, 1, "only B's log entry");
}

#[tokio::test]
async fn a_transactional_job_locks_its_row_when_it_starts_and_not_if_it_was_reset() {
    let db = Db::new().await;
    let ids = db.enqueue(3, json!({})).await;
    // Two connections: claimed jobs hold none until they open.
    let pool = db.db.pool(2).await.unwrap();
    let store = Arc::new(
        DbStore::<Job>::new(&pool, &db.table().await, db.options())
            .await
            .unwrap(),
    );
    let mut jobs = store
        .dequeue("host", &DbConditions::new(), 3)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 3);
    assert!(jobs.iter_mut().all(|j| j.tx().is_none()));
    assert_eq!(jobs[0].record().id, ids[0]);

    assert!(store.open(&mut jobs[0]).await.unwrap());
    assert!(jobs[0].tx().is_some(), "an opened job has its transaction");
    // The resetter skips the locked row, and resets the two unopened ones.
    db.age_heartbeats().await;
    let out = store.reset_stalled().await.unwrap();
    let mut reset: Vec<i64> = out.reset.iter().map(|r| r.0).collect();
    reset.sort_unstable();
    assert_eq!(reset, ids[1..].to_vec());
    // A job reset between its claim and its open must not run.
    assert!(!store.open(&mut jobs[1]).await.unwrap());
    assert!(jobs[1].tx().is_none());
    assert_eq!(db.state(ids[1]).await, "queued");

    assert!(store.mark_complete(&mut jobs[0]).await.unwrap());
    assert_eq!(db.state(ids[0]).await, "completed");
}

#[tokio::test]
async fn eight_workers_process_1000_jobs_exactly_once() {
    let db = Db::new().await;
    let ids = db.enqueue(1000, json!({"act": "write"})).await;
    let store = db.store(Handling::Transactional).await;
    let mut runs = Vec::new();
    let mut shutdowns = Vec::new();
    for w in 0..8 {
        let mut o = options(&format!("w{w}"));
        o.num_handlers = 4;
        o.interval = Duration::from_millis(10);
        let worker = new_worker(store.clone(), Script::default(), o).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    // Wait until every job completed, then stop the workers.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while db.count("completed").await < 1000 {
        assert!(std::time::Instant::now() < deadline, "jobs did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in &shutdowns {
        s.graceful();
    }
    let mut dequeued = 0;
    for r in runs {
        let summary = r.await.unwrap();
        assert_eq!(summary.reason, StopReason::Graceful);
        dequeued += summary.dequeued;
    }
    assert_eq!(
        dequeued, 1000,
        "each job dequeued exactly once across all workers"
    );
    let dup: i64 = sqlx::query_scalar("SELECT count(*) FROM (SELECT job_id FROM side_effects GROUP BY job_id HAVING count(*) <> 1) d")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(dup, 0, "each job's side effect exactly once");
    let total: i64 = sqlx::query_scalar("SELECT count(DISTINCT job_id) FROM side_effects")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(total, ids.len() as i64);
}

#[tokio::test]
async fn extra_conditions_from_pre_dequeue_select_jobs() {
    let db = Db::new().await;
    let ids = db.enqueue(4, json!({"act": "ok"})).await;
    sqlx::query("UPDATE jobs SET cost = CASE WHEN id % 2 = 0 THEN 10 ELSE 90 END")
        .execute(&db.pool)
        .await
        .unwrap();
    let store = db.store(Handling::Transactional).await;
    let mut o = options("budget");
    o.num_total_jobs = Some(2);
    o.num_handlers = 4;
    new_worker(
        store,
        Script {
            max_cost: Some(50),
            ..Default::default()
        },
        o,
    )
    .unwrap()
    .run()
    .await;
    for id in ids {
        let want = if id % 2 == 0 { "completed" } else { "queued" };
        assert_eq!(db.state(id).await, want, "job {id}");
    }
}

#[tokio::test]
async fn resetter_requeues_then_fails_stalled_jobs_and_two_resetters_do_not_conflict() {
    let db = Db::new().await;
    let ids = db.enqueue(20, json!({})).await;
    let table = db.table().await;
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = Duration::from_secs(5);
    ro.stall.max_num_resets = 1;
    let r1 = Resetter::new(&db.pool, &table, ro.clone()).await.unwrap();
    let r2 = Resetter::new(&db.pool, &table, ro).await.unwrap();
    let claim = || async {
        sqlx::query("UPDATE jobs SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'h'")
            .execute(&db.pool)
            .await
            .unwrap();
    };
    claim().await;
    // Fresh heartbeats: nothing is stalled.
    assert_eq!(r1.reset_once().await.unwrap(), Default::default());
    db.age_heartbeats().await;
    let (a, b) = tokio::join!(r1.reset_once(), r2.reset_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut reset: Vec<i64> = a.reset.iter().chain(&b.reset).map(|r| r.0).collect();
    reset.sort_unstable();
    assert_eq!(reset, ids, "every stalled job reset exactly once");
    assert!(
        a.reset
            .iter()
            .all(|(_, age)| *age >= Duration::from_secs(3599))
    );
    assert_eq!(db.count("queued").await, 20);
    let max_resets: i32 = sqlx::query_scalar("SELECT max(num_resets) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(max_resets, 1);
    let host: String = db
        .scalar("SELECT worker_hostname FROM jobs WHERE id = $1", ids[0])
        .await;
    assert_eq!(host, "", "the hostname is cleared");
    // Stalled again: out of resets, so failed with the message.
    claim().await;
    db.age_heartbeats().await;
    let out = r1.reset_once().await.unwrap();
    assert_eq!(out.failed, ids);
    let msg: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", ids[0])
        .await;
    assert_eq!(msg, dbworker::DEFAULT_RESET_FAILURE_MESSAGE);
}

#[tokio::test]
async fn queued_count_any_and_max_age() {
    use workerutil::Store;
    let db = Db::new().await;
    let store = db.store(Handling::Heartbeat).await;
    assert_eq!(store.queued_count().await.unwrap(), 0);
    assert!(!store.any_queued().await.unwrap());
    assert_eq!(store.max_age_in_queue().await.unwrap(), Duration::ZERO);
    db.enqueue(3, json!({})).await;
    sqlx::query("UPDATE jobs SET queued_at = now() - interval '90 seconds' WHERE id = (SELECT min(id) FROM jobs)")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(store.queued_count().await.unwrap(), 3);
    assert!(store.any_queued().await.unwrap());
    let age = store.max_age_in_queue().await.unwrap();
    assert!(
        age >= Duration::from_secs(90) && age < Duration::from_secs(100),
        "{age:?}"
    );
}

/// The error `JobTable::new` reports for `t`, rendered.
async fn table_error(db: &Db, t: JobTableOptions) -> String {
    JobTable::new(&db.pool, t)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

/// The error `DbStore::new` reports for `o` over the test table, rendered.
async fn store_error(db: &Db, o: StoreOptions) -> String {
    store_error_on(db, &db.table().await, o).await
}

/// The error `DbStore::new` reports for `o` over `table`, rendered.
async fn store_error_on(db: &Db, table: &JobTable, o: StoreOptions) -> String {
    DbStore::<Job>::new(&db.pool, table, o)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[tokio::test]
async fn bad_configuration_is_reported_with_every_name() {
    let db = Db::new().await;

    let mut t = Db::table_options();
    t.table_name = "missing_jobs j".into();
    let err = table_error(&db, t).await;
    assert!(err.contains("table missing_jobs does not exist"), "{err}");

    sqlx::raw_sql("ALTER TABLE jobs DROP COLUMN cancel, DROP COLUMN num_resets; ALTER TABLE jobs ALTER COLUMN started_at TYPE timestamp")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut t = Db::table_options();
    t.alternate_column_names
        .insert("state".into(), "status".into());
    let err = table_error(&db, t).await;
    for needle in [
        "table jobs has no column cancel",
        "table jobs has no column num_resets",
        "table jobs has no column status (standard column state)",
        "column jobs.started_at has type timestamp, expected one of timestamptz",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }

    let db = Db::new().await;
    let mut t = Db::table_options();
    t.view_name = Some("no_such_view v".into());
    let err = table_error(&db, t).await;
    assert!(err.contains("view no_such_view does not exist"), "{err}");

    // The table's read shape is checked when a store first reads through it.
    let table = db
        .table_with(|t| t.column_expressions = vec!["j.id".into(), "j.no_such_column".into()])
        .await;
    let err = store_error_on(&db, &table, db.options()).await;
    assert!(
        err.contains("column j.no_such_column does not exist"),
        "{err}"
    );

    let table = db
        .table_with(|t| t.order_by = Some("j.priority DESC".into()))
        .await;
    let err = store_error_on(&db, &table, db.options()).await;
    assert!(err.contains("column j.priority does not exist"), "{err}");

    let mut o = db.options();
    o.retry.jitter = 2.0;
    let err = store_error(&db, o).await;
    assert!(err.contains("invalid option `retry.jitter`"), "{err}");
}

#[tokio::test]
async fn worker_options_that_do_not_fit_the_store_are_rejected() {
    let db = Db::new().await;
    let small = db.db.pool(3).await.unwrap();
    let store = Arc::new(
        DbStore::new(&small, &db.table().await, db.options())
            .await
            .unwrap(),
    );
    let mut o = options("w");
    o.num_handlers = 4;
    let err = new_worker(store.clone(), Script::default(), o).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PoolTooSmall {
                max_connections: 3,
                needed: 6,
                ..
            }
        ),
        "{err}"
    );

    let mut o = options("w");
    o.heartbeat_interval = Duration::from_secs(3);
    o.heartbeat_failure_limit = Some(Duration::from_secs(4));
    let err = new_worker(store.clone(), Script::default(), o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("heartbeat_interval"), "{err}");

    let mut o = options("w");
    o.heartbeat_failure_limit = Some(Duration::from_secs(10));
    let err = new_worker(store, Script::default(), o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("heartbeat_failure_limit"), "{err}");
}

#[tokio::test]
async fn worker_new_runs_the_store_checks_too() {
    let db = Db::new().await;
    let store = db.store(Handling::Transactional).await;
    let mut o = options("w");
    // 2 s + 3 × 1.5 s is not below the 5 s stalled max age.
    o.heartbeat_interval = Duration::from_millis(1500);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    let err = Worker::new(store.clone(), Script::default(), o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("heartbeat_failure_limit"), "{err}");
    let table = db.table().await;
    let store_on_pool_of = async |connections: u32| {
        Arc::new(
            DbStore::new(
                &db.db.pool(connections).await.unwrap(),
                &table,
                db.options(),
            )
            .await
            .unwrap(),
        )
    };
    let small = store_on_pool_of(3).await;
    let mut o = options("w");
    o.num_handlers = 2;
    o.claim_ahead = Some(8);
    let err = Worker::new(small, Script::default(), o)
        .unwrap_err()
        .to_string();
    // Claimed-ahead jobs hold no connection: only the 2 running ones do.
    assert!(err.contains("4 are needed"), "{err}");
    // Each claim beyond the first that may be in flight needs a connection too.
    let small = store_on_pool_of(4).await;
    let mut o = options("w");
    o.num_handlers = 2;
    Worker::new(small.clone(), Script::default(), o.clone()).expect("2 handlers + 2 fit 4");
    o.concurrent_dequeues = Some(3);
    let err = Worker::new(small, Script::default(), o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("6 are needed"), "{err}");
    assert!(err.contains("2 for further concurrent claims"), "{err}");
}

#[tokio::test]
async fn default_worker_options_fit_a_default_store() {
    let db = Db::new().await;
    let table = JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap();
    let store = Arc::new(
        DbStore::new(&db.pool, &table, StoreOptions::new("defaults"))
            .await
            .unwrap(),
    );
    new_worker(store, Script::default(), WorkerOptions::new("defaults"))
        .expect("the defaults must work together");
}

#[tokio::test]
async fn the_resetter_checks_its_table_at_start_up() {
    let db = Db::new().await;
    let ok = Resetter::new(&db.pool, &db.table().await, ResetterOptions::new("r"))
        .await
        .unwrap();
    ok.check().await.unwrap();
    // The resetter's table is checked by the `JobTable` it is built on.
    let err = table_error(&db, JobTableOptions::new("no_jobs")).await;
    assert!(err.contains("table no_jobs does not exist"), "{err}");
    let mut renamed = JobTableOptions::new("jobs");
    renamed
        .alternate_column_names
        .insert("state".into(), "status".into());
    let err = table_error(&db, renamed).await;
    assert!(
        err.contains("table jobs has no column status (standard column state)"),
        "{err}"
    );
}

#[test]
fn the_resetter_counts_what_it_does_in_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A current-thread runtime keeps every task on this thread, where the recorder is installed.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = Db::new().await;
            db.enqueue(3, json!({})).await;
            sqlx::query("UPDATE jobs SET state = 'processing', started_at = now(), last_heartbeat_at = now() - interval '1 hour', num_resets = CASE WHEN id = (SELECT min(id) FROM jobs) THEN 5 ELSE 0 END")
                .execute(&db.pool)
                .await
                .unwrap();
            let r = Resetter::new(&db.pool, &db.table().await, ResetterOptions::new("r")).await.unwrap();
            let out = r.reset_once().await.unwrap();
            assert_eq!((out.reset.len(), out.failed.len()), (2, 1));
        })
    });
    let mut counters = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            counters.insert(key.key().name().to_owned(), n);
        }
    }
    assert_eq!(
        counters.get(dbworker::metrics::RESETS_TOTAL),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(dbworker::metrics::RESET_FAILURES_TOTAL),
        Some(&1),
        "{counters:?}"
    );
}

#[tokio::test]
async fn run_until_empty_drains_the_table_and_returns() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        let ids = db.enqueue(40, json!({})).await;
        let store = db.store(handling).await;
        let mut o = options("run-once");
        o.num_handlers = 4;
        let summary = dbworker::new_worker(store.clone(), common::Completes, o)
            .unwrap()
            .run_until_empty()
            .await;
        assert_eq!(
            summary.reason,
            workerutil::StopReason::QueueEmpty,
            "{handling:?}"
        );
        assert_eq!(summary.dequeued, ids.len() as u64, "{handling:?}");
        assert_eq!(db.count("completed").await, 40, "{handling:?}");
        store.close().await;
    }
}

/// Every job whose outcome waits for the grouped writer keeps its mark's
/// future alive (up to a thousand at once on a busy worker), so the common
/// completion's future must stay small: inline, the rare paths made it
/// 10 KB, and a 64-handler worker's peak RSS 14 MB higher.
#[tokio::test]
async fn a_grouped_completion_waits_in_a_small_future() {
    let db = Db::new().await;
    let ids = db.enqueue(1, json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let mut jobs = store
        .dequeue("small-future", &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    let mut job = jobs.pop().unwrap();
    let completion = store.mark_complete(&mut job);
    let size = std::mem::size_of_val(&completion);
    assert!(
        size <= 1024,
        "a grouped completion's future is {size} bytes"
    );
    assert!(completion.await.unwrap());
    assert_eq!(db.state(ids[0]).await, "completed");
}
