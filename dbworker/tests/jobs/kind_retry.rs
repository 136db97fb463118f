//! Per-kind retry policies on Postgres: a kind's retry limit and delay
//! override the store's, a job's own `max_retries` column overrides both, and
//! the retry is decided on the database's clock, in both handling modes.

use crate::common;

use dbworker::{DbJob, DbStore, Handling, Retry, RetryPolicy, new_worker};
use serde_json::json;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext, KindOptions, KindRegistry, WorkerOptions};

use common::{Db, Job};

/// Fails every job it is given.
struct Fails;
impl Handler<DbStore<Job>> for Fails {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::retryable("still broken"))
    }
}

/// Fails, and answers its own retry policy: retried once, a day later.
struct FailsRetriedDaily;
impl Handler<DbStore<Job>> for FailsRetriedDaily {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Fails.handle(job, ctx).await
    }

    fn retry(&self, _record: &Job) -> Option<Retry> {
        let daily = RetryPolicy::fixed(Duration::from_secs(86_400));
        Some(Retry::new().max_retries(1).delay(daily))
    }
}

fn kind_of(job: &Job) -> &str {
    job.payload["kind"].as_str().unwrap_or("")
}

/// The store retries 5 times at once; "charge" once, "slow" after an hour,
/// "report" as its handler says.
fn registry() -> KindRegistry<DbStore<Job>> {
    let slow = Retry::new().delay(RetryPolicy::fixed(Duration::from_secs(3600)));
    KindRegistry::new(kind_of)
        .register_with(
            "charge",
            Fails,
            KindOptions::retry(Retry::new().max_retries(1)),
        )
        .unwrap()
        .register("email", Fails)
        .unwrap()
        .register_with("slow", Fails, KindOptions::retry(slow))
        .unwrap()
        .register("report", FailsRetriedDaily)
        .unwrap()
}

/// Seconds from the job's last finish to its next attempt, on the database clock.
async fn delay(db: &Db, id: i64) -> f64 {
    db.scalar(
        "SELECT EXTRACT(EPOCH FROM process_after - finished_at)::float8 FROM jobs WHERE id = $1",
        id,
    )
    .await
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o
}

async fn failures(db: &Db, id: i64) -> i32 {
    db.scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await
}

async fn each_kind_retries_as_it_says(handling: Handling) {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.max_retries = true;
            c.kind = true;
        },
        &[],
    )
    .await;
    let enqueue = |kind: &str| db.enqueue(1, json!({ "kind": kind }));
    let charge = enqueue("charge").await[0];
    let email = enqueue("email").await[0];
    let slow = enqueue("slow").await[0];
    let report = enqueue("report").await[0];
    // Its own column says 3: it wins over the kind's one retry.
    let charge_own = enqueue("charge").await[0];
    sqlx::query("UPDATE jobs SET max_retries = 3 WHERE id = $1")
        .bind(charge_own)
        .execute(&db.pool)
        .await
        .unwrap();

    let table = db
        .table_with(|t| t.max_retries_column = Some("max_retries".into()))
        .await;
    let mut so = db.options();
    so.handling = handling;
    so.max_num_retries = 5;
    let store = db.store_on(&table, so).await;
    // 2 + 6 + 1 + 1 + 4 attempts: the delayed two are not due yet. (Not
    // `run_until_empty`: in heartbeat handling it can stop while a retry's
    // grouped mark is still being written.)
    let mut o = options("kinds");
    o.num_handlers = 3;
    o.num_total_jobs = Some(14);
    let worker = new_worker(store, registry(), o).unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(60), worker.run())
        .await
        .expect("14 attempts within a minute");
    assert_eq!(summary.dequeued, 14, "{handling:?}");

    assert_eq!(db.state(charge).await, "failed", "charge: {handling:?}");
    assert_eq!(failures(&db, charge).await, 2, "charge: one retry");
    assert_eq!(db.state(email).await, "failed");
    assert_eq!(
        failures(&db, email).await,
        6,
        "email: the store's 5 retries"
    );
    assert_eq!(db.state(charge_own).await, "failed");
    assert_eq!(
        failures(&db, charge_own).await,
        4,
        "the job's own max_retries (3) wins over its kind's"
    );

    // dbworker/docs/operations.md, "Per-kind retry limits".
    db.execute("UPDATE jobs SET kind = payload->>'kind'").await;
    let per_kind: Vec<(String, i32, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(
        "SELECT kind, num_failures AS attempts_failed, count(*) AS jobs
  FROM example_jobs
 WHERE state = 'failed' AND finished_at > now() - interval '24 hours'
 GROUP BY kind, num_failures ORDER BY kind, num_failures"
            .replace("example_jobs", "jobs"),
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let row = |kind: &str, failures, jobs| (kind.to_owned(), failures, jobs);
    assert_eq!(
        per_kind,
        [row("charge", 2, 1), row("charge", 4, 1), row("email", 6, 1)]
    );

    assert_eq!(db.state(slow).await, "errored");
    let slow_delay = delay(&db, slow).await;
    assert!(
        (slow_delay - 3600.0).abs() < 1.0,
        "slow: the kind's hour, got {slow_delay}"
    );
    assert_eq!(db.state(report).await, "errored");
    let report_delay = delay(&db, report).await;
    assert!(
        (report_delay - 86_400.0).abs() < 1.0,
        "report: its handler's day, got {report_delay}"
    );
    // Once due, the report's second error is final (its handler's one retry).
    sqlx::query("UPDATE jobs SET process_after = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut so = db.options();
    so.handling = handling;
    so.max_num_retries = 5;
    let store = db.store_on(&table, so).await;
    let mut o = options("kinds-again");
    o.num_total_jobs = Some(1);
    let only_report = KindRegistry::new(kind_of)
        .register("report", FailsRetriedDaily)
        .unwrap()
        .restrict_dequeue(|kinds| {
            dbworker::DbConditions::new().and_sql("j.payload->>'kind' = ANY($1)", [kinds.to_vec()])
        });
    new_worker(store, only_report, o).unwrap().run().await;
    assert_eq!(db.state(report).await, "failed");
    assert_eq!(failures(&db, report).await, 2);
}

#[tokio::test]
async fn each_kind_retries_as_it_says_with_transactional_handling() {
    each_kind_retries_as_it_says(Handling::Transactional).await;
}

#[tokio::test]
async fn each_kind_retries_as_it_says_with_heartbeat_handling() {
    each_kind_retries_as_it_says(Handling::Heartbeat).await;
}

#[tokio::test]
async fn grouped_marks_of_different_kinds_each_get_their_own_rule() {
    use workerutil::Store;
    let db = Db::new().await;
    let ids = db.enqueue(40, json!({})).await;
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    so.max_num_retries = 5;
    let store = DbStore::<Job>::new(&db.pool, &db.table().await, so)
        .await
        .unwrap();
    let mut jobs = store.dequeue("h", &Default::default(), 40).await.unwrap();
    assert_eq!(jobs.len(), 40);
    // Even ids: no retry at all; multiples of 3: an hour's delay; the rest: the store's.
    let final_now = Retry::new().max_retries(0);
    let hourly = Retry::new().delay(RetryPolicy::fixed(Duration::from_secs(3600)));
    let rule = |id: i64| match (id % 2, id % 3) {
        (0, _) => Some(&final_now),
        (_, 0) => Some(&hourly),
        _ => None,
    };
    // All at once: the grouped-mark writer groups them into as few statements as it can.
    let marks = jobs.iter_mut().map(|job| {
        let id = job.record().id;
        store.mark_errored(job, "boom", rule(id))
    });
    for marked in futures_util::future::join_all(marks).await {
        assert!(marked.unwrap().is_some());
    }
    for id in ids {
        let state = db.state(id).await;
        let expected_delay = match (id % 2, id % 3) {
            (0, _) => {
                assert_eq!(state, "failed", "{id}");
                continue;
            }
            (_, 0) => 3600.0,
            _ => 0.0,
        };
        assert_eq!(state, "errored", "{id}");
        let delay = delay(&db, id).await;
        assert!((delay - expected_delay).abs() < 1.0, "{id}: {delay}");
    }
}

/// A job that has failed a thousand times and more still gets its retry
/// written, at the policy's cap: the backoff's power stops where the delay
/// reaches `max_delay` (before, it overflowed float8 at the 1,021st failure
/// with the default policy, or the 309th with a factor of 10, and the
/// failure could not be marked at all). Each handling mode, single and
/// grouped marks; the kind's policy too.
#[tokio::test]
async fn a_job_that_failed_a_thousand_times_is_retried_at_the_cap() {
    for (handling, factor) in [
        (Handling::Transactional, 2.0),
        (Handling::Heartbeat, 2.0),
        (Handling::Transactional, 10.0),
        (Handling::Heartbeat, 1e200),
    ] {
        let case = format!("{handling:?}, factor {factor}");
        let db = Db::new().await;
        let mut o = db.options();
        o.handling = handling;
        o.max_num_retries = 1_000_000;
        o.retry = RetryPolicy {
            backoff_factor: factor,
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let store = db.store_on(&db.table().await, o).await;
        let id = db.enqueue(1, json!({})).await[0];
        db.execute("UPDATE jobs SET num_failures = 1100").await;
        let mut w = options("thousand");
        w.num_total_jobs = Some(1);
        new_worker(store, Fails, w).unwrap().run().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while db.state(id).await != "errored" {
            assert!(
                std::time::Instant::now() < deadline,
                "{case}: the failure was never marked ({})",
                db.state(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(failures(&db, id).await, 1101, "{case}");
        assert!(
            (delay(&db, id).await - 3600.0).abs() < 1.0,
            "{case}: retried after {} s, not the 1 h cap",
            delay(&db, id).await
        );
        let message: String = db
            .scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
            .await;
        assert!(message.contains("still broken"), "{case}: {message}");
    }
}
