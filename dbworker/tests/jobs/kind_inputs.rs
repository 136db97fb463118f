//! Per-kind settings that would break every job of a kind, on real Postgres:
//! a zero maximum runtime and a retry policy that skipped
//! `KindOptions::with_retry`'s check are refused where a kind is set up, and
//! a handler answering them per job gets the worker's runtime and the store's
//! delay instead (with a warning), never an instant timeout or retry.

use crate::common;

use dbworker::{DbJob, DbStore, Handling, Retry, RetryPolicy, new_worker};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext, KindOptions, KindRegistry, WorkerOptions};

use common::{Completes, Db, Job};

/// A delay that fails `RetryPolicy::check`: every other retry would come
/// before the error (`10 s × (-3)^n`).
fn backwards() -> RetryPolicy {
    RetryPolicy {
        retry_after: Duration::from_secs(10),
        backoff_factor: -3.0,
        max_delay: Duration::from_secs(3600),
        jitter: 0.0,
    }
}

/// Completes after 50 ms, or errors when the payload says `fail`; answers a
/// zero runtime and the backwards delay for every job.
struct BadAnswers;
impl Handler<DbStore<Job>> for BadAnswers {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if job.record().payload["fail"] == json!(true) {
            return Err(HandlerError::retryable("upstream down"));
        }
        Ok(())
    }

    fn max_runtime(&self, _record: &Job) -> Option<Duration> {
        Some(Duration::ZERO)
    }

    fn retry(&self, _record: &Job) -> Option<Retry> {
        Some(Retry::new().max_retries(5).delay(backwards()))
    }
}

async fn bad_answers_fall_back(handling: Handling) {
    let db = Db::new().await;
    let done = db.enqueue(1, json!({})).await[0];
    // One failure already: the next delay would be 10 s × -3.
    let failing = db.enqueue(1, json!({ "fail": true })).await[0];
    db.execute(&format!(
        "UPDATE jobs SET num_failures = 1 WHERE id = {failing}"
    ))
    .await;
    let mut so = db.options();
    so.handling = handling;
    so.retry = RetryPolicy::fixed(Duration::from_secs(3600));
    let store = Arc::new(DbStore::new(&db.pool, &db.table().await, so).await.unwrap());
    let mut o = WorkerOptions::new("bad-answers");
    o.interval = Duration::from_millis(10);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.num_handlers = 2;
    o.num_total_jobs = Some(2);
    let worker = new_worker(store, BadAnswers, o).unwrap();
    tokio::time::timeout(Duration::from_secs(60), worker.run())
        .await
        .expect("two attempts");
    assert_eq!(
        db.state(done).await,
        "completed",
        "{handling:?}: a zero runtime is the worker's (none)"
    );
    assert_eq!(db.state(failing).await, "errored", "{handling:?}");
    let delay: f64 = db
        .scalar(
            "SELECT EXTRACT(EPOCH FROM process_after - finished_at)::float8 FROM jobs WHERE id = $1",
            failing,
        )
        .await;
    assert!(
        (delay - 3600.0).abs() < 1.0,
        "{handling:?}: the store's hour, not a retry before the error: {delay}"
    );
}

#[tokio::test]
async fn a_handlers_zero_runtime_and_backwards_delay_fall_back_in_heartbeat_handling() {
    bad_answers_fall_back(Handling::Heartbeat).await;
}

#[tokio::test]
async fn a_handlers_zero_runtime_and_backwards_delay_fall_back_in_transactional_handling() {
    bad_answers_fall_back(Handling::Transactional).await;
}

fn kind_of(job: &Job) -> &str {
    job.payload["kind"].as_str().unwrap_or("")
}

/// What registering `options` for kind "email" answers: the error's text.
fn refusal(options: KindOptions) -> String {
    KindRegistry::<DbStore<Job>>::new(kind_of)
        .register_with("email", Completes, options)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn a_kind_with_a_zero_runtime_or_an_unchecked_delay_is_refused_not_a_panic() {
    let message = refusal(KindOptions::max_runtime(Duration::ZERO));
    assert!(
        message.contains("\"email\"") && message.contains("max_runtime"),
        "{message}"
    );
    let mut zero = KindOptions::default();
    zero.max_runtime = Some(Duration::ZERO);
    let message = refusal(zero);
    assert!(
        message.contains("\"email\"") && message.contains("max_runtime"),
        "{message}"
    );
    let message = refusal(KindOptions::retry(Retry::new().delay(backwards())));
    assert!(
        message.contains("\"email\"") && message.contains("retry.delay.backoff_factor"),
        "{message}"
    );
    assert_eq!(
        refusal(KindOptions::default()),
        "",
        "valid options are registered"
    );
}

#[test]
fn a_kind_registered_twice_or_an_alias_of_nothing_is_refused() {
    let registry = KindRegistry::<DbStore<Job>>::new(kind_of)
        .register("email", Completes)
        .unwrap();
    let twice = registry.register("email", Completes).unwrap_err();
    assert!(
        matches!(&twice, workerutil::Error::DuplicateKind(k) if k == "email"),
        "{twice}"
    );
    let registry = KindRegistry::<DbStore<Job>>::new(kind_of)
        .register("email", Completes)
        .unwrap();
    let dangling = registry.alias("mail", "sms").unwrap_err().to_string();
    assert!(dangling.contains("\"sms\""), "{dangling}");
    let empty = KindRegistry::<DbStore<Job>>::new(kind_of)
        .register("", Completes)
        .unwrap_err()
        .to_string();
    assert!(empty.contains("empty"), "{empty}");
}
