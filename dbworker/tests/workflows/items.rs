//! Item jobs on Postgres: a job whose payload is an array completes when
//! every item succeeded, and is otherwise retried with only its failed items,
//! written by the fenced errored mark, in both handling modes.

use crate::common;

use dbworker::items::{ItemHandler, ItemJobs, ItemResult};
use dbworker::{DbStore, Handling, JobTable, new_worker};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use workerutil::{Store, WorkerOptions};

use common::{Db, Job};

/// Fails the items whose `n` is in `fail_once` the first time it sees them;
/// records the items of every attempt.
#[derive(Clone, Default)]
struct Items {
    fail_once: HashSet<i64>,
    failed: Arc<Mutex<HashSet<i64>>>,
    attempts: Arc<Mutex<Vec<Vec<Value>>>>,
}
impl ItemHandler<Job> for Items {
    async fn handle_items(&self, _job: &Job, items: &[Value]) -> Vec<ItemResult> {
        self.attempts.lock().unwrap().push(items.to_vec());
        items
            .iter()
            .map(|item| {
                let n = item["n"].as_i64().unwrap_or(-1);
                if self.fail_once.contains(&n) && self.failed.lock().unwrap().insert(n) {
                    Err(format!("item {n} is not ready").into())
                } else {
                    Ok(())
                }
            })
            .collect()
    }
}

impl Items {
    fn attempts(&self) -> Vec<Vec<Value>> {
        self.attempts.lock().unwrap().clone()
    }
}

fn five_items() -> Value {
    Value::Array((0..5).map(|n| json!({ "n": n })).collect())
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.num_total_jobs = Some(1);
    o
}

async fn store(db: &Db, handling: Handling) -> Arc<DbStore<Job>> {
    let mut so = db.options();
    so.handling = handling;
    so.max_num_retries = 3;
    let table = db
        .table_with(|t| t.payload_column = Some("payload".into()))
        .await;
    db.store_on(&table, so).await
}

/// Runs one attempt of the next job with `items`.
async fn attempt(store: &Arc<DbStore<Job>>, items: &Items) {
    let handler = ItemJobs::new(items.clone(), |job: &Job| &job.payload);
    let worker = new_worker(store.clone(), handler, options("items")).unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(30), worker.run())
        .await
        .expect("one attempt");
    assert_eq!(summary.dequeued, 1);
}

async fn payload(db: &Db, id: i64) -> Value {
    db.scalar("SELECT payload FROM jobs WHERE id = $1", id)
        .await
}

async fn failures(db: &Db, id: i64) -> i32 {
    db.scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await
}

async fn failure_message(db: &Db, id: i64) -> String {
    db.scalar::<Option<String>>("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await
        .unwrap_or_default()
}

async fn failed_items_are_retried_alone(handling: Handling) {
    let db = Db::new().await;
    let id = db.enqueue(1, five_items()).await[0];
    let store = store(&db, handling).await;
    let items = Items {
        fail_once: HashSet::from([1, 3]),
        ..Items::default()
    };

    attempt(&store, &items).await;
    assert_eq!(db.state(id).await, "errored", "{handling:?}");
    assert_eq!(failures(&db, id).await, 1);
    assert_eq!(
        payload(&db, id).await,
        json!([{ "n": 1 }, { "n": 3 }]),
        "only the failed items are left"
    );
    // dbworker/docs/operations.md, "Item jobs with items left".
    let left: Vec<(i64, String, i32, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(
        "SELECT id, state, num_failures, jsonb_array_length(payload) AS items_left,
       process_after AS next_attempt, left(failure_message, 200) AS failure_message
  FROM example_jobs
 WHERE state IN ('errored', 'failed')
   AND jsonb_typeof(payload) = 'array'
   AND failure_message LIKE '% items failed (%'
 ORDER BY finished_at DESC
 LIMIT 50"
            .replace("example_jobs", "jobs"),
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(left, vec![(id, "errored".to_owned(), 1, 2)]);
    let message = failure_message(&db, id).await;
    assert!(
        message.contains("2 of 5 items failed")
            && message.contains("item 1: item 1 is not ready")
            && message.contains("item 3: item 3 is not ready"),
        "{message}"
    );

    attempt(&store, &items).await;
    assert_eq!(db.state(id).await, "completed", "{handling:?}");
    assert_eq!(failures(&db, id).await, 1);
    let attempts = items.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].len(), 5);
    assert_eq!(
        attempts[1],
        vec![json!({ "n": 1 }), json!({ "n": 3 })],
        "the retry handles exactly the failed items"
    );
}

#[tokio::test]
async fn failed_items_are_retried_alone_with_transactional_handling() {
    failed_items_are_retried_alone(Handling::Transactional).await;
}

#[tokio::test]
async fn failed_items_are_retried_alone_with_heartbeat_handling() {
    failed_items_are_retried_alone(Handling::Heartbeat).await;
}

#[tokio::test]
async fn an_item_job_whose_items_all_succeed_completes_at_once() {
    let db = Db::new().await;
    let id = db.enqueue(1, five_items()).await[0];
    let store = store(&db, Handling::Transactional).await;
    let items = Items::default();
    attempt(&store, &items).await;
    assert_eq!(db.state(id).await, "completed");
    assert_eq!(failures(&db, id).await, 0);
    assert_eq!(payload(&db, id).await, five_items(), "payload untouched");
    assert_eq!(items.attempts().len(), 1);
}

#[tokio::test]
async fn a_payload_that_is_not_an_array_fails_the_job_with_the_reason() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({ "n": 1 })).await[0];
    let store = store(&db, Handling::Heartbeat).await;
    let items = Items::default();
    attempt(&store, &items).await;
    assert_eq!(db.state(id).await, "failed", "final despite 3 retries left");
    assert_eq!(
        failure_message(&db, id).await,
        "an item job's payload must be a JSON array of items, not an object"
    );
    assert!(items.attempts().is_empty(), "the handler never ran");
    assert_eq!(payload(&db, id).await, json!({ "n": 1 }));
}

#[tokio::test]
async fn a_stale_attempt_cannot_rewrite_the_payload() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        let id = db.enqueue(1, five_items()).await[0];
        let store = store(&db, handling).await;
        let no_conditions = Default::default();
        let mut stale = store.dequeue("a", &no_conditions, 1).await.unwrap();
        // Stalled, reset and claimed again: a new token.
        db.age_heartbeats().await;
        store.reset_stalled().await.unwrap();
        let mut fresh = store.dequeue("b", &no_conditions, 1).await.unwrap();
        assert_eq!(fresh.len(), 1, "{handling:?}");

        stale[0].retry_with_payload(json!([{ "n": "stale" }]));
        assert!(
            store
                .mark_errored(&mut stale[0], "stale", None)
                .await
                .unwrap()
                .is_none(),
            "{handling:?}: the stale mark is refused"
        );
        assert_eq!(db.state(id).await, "processing");
        assert_eq!(payload(&db, id).await, five_items(), "{handling:?}");

        fresh[0].retry_with_payload(json!([{ "n": 4 }]));
        assert!(
            store
                .mark_errored(&mut fresh[0], "one left", None)
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(db.state(id).await, "errored");
        assert_eq!(payload(&db, id).await, json!([{ "n": 4 }]), "{handling:?}");
    }
}

#[tokio::test]
async fn item_jobs_need_a_jsonb_payload_column() {
    let db = Db::new().await;
    let mut t = Db::table_options();
    t.payload_column = Some("cost".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(
        err.contains("cost (payload_column) has type int4, expected jsonb"),
        "{err}"
    );
    // Without the column the job fails with the reason, and nothing runs.
    let id = db.enqueue(1, five_items()).await[0];
    let store = db.store_on(&db.table().await, db.options()).await;
    let items = Items::default();
    attempt(&store, &items).await;
    assert_eq!(db.state(id).await, "failed");
    assert!(
        failure_message(&db, id)
            .await
            .contains("JobTableOptions::payload_column"),
    );
    assert!(items.attempts().is_empty());
}
