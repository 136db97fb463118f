//! NUL characters (U+0000), which Postgres's `text` and `jsonb` cannot hold,
//! on real Postgres: a handler's result or payload to retry with holding one
//! fails that job at once with the reason (never left `processing`), in both
//! handling modes, while the other jobs complete; an enqueue holding one is
//! refused naming the field (a workflow's task name too); a forbidden flag,
//! queue or kind holding one never stops the claims.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbConditions, DbJob, DbStore, Enqueuer, ForbiddenFlags, Handling, NewJob, new_worker,
    queues::{QueueWorkers, QueueWorkersOptions},
    workflow::{Task, Workflow},
};
use serde_json::{Value, json};
use workerutil::{Handler, HandlerError, JobContext, Store, WorkerOptions};

use common::{Completes, Db, Job};

/// A string holding a NUL, which no stored payload can carry: the handler
/// makes it.
const NUL: &str = "a\u{0}b";

/// `payload.fail_with_nul`: fails with a message holding a NUL;
/// `payload.retry_with`: errors, to be retried with these items (and, with
/// `payload.nul`, one holding a NUL); else stores `payload.result` (with
/// `payload.nul`, `{"s": NUL}`) as the result, ignoring a refusal, and completes.
struct Writes;
impl Handler<DbStore<Job>> for Writes {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let payload = job.record().payload.clone();
        if payload["fail_with_nul"] == json!(true) {
            return Err(HandlerError::non_retryable(format!("bad {NUL}")));
        }
        let nul = payload["nul"] == json!(true);
        if let Some(items) = payload["retry_with"].as_array() {
            let mut items = items.clone();
            if nul {
                items.push(json!(NUL));
            }
            job.retry_with_payload(json!({ "items": items }));
            return Err(HandlerError::retryable("two items left"));
        }
        let result = if nul {
            json!({ "s": NUL })
        } else {
            payload["result"].clone()
        };
        if let Err(err) = job.set_result(result) {
            // What the handler sees names where the NUL is.
            assert!(err.to_string().contains("NUL character"), "{err}");
        }
        Ok(())
    }
}

/// Runs `jobs` attempts with 2 handlers; the marks are written when it returns.
async fn run(store: Arc<DbStore<Job>>, jobs: u64) {
    let mut o = WorkerOptions::new("nul");
    o.num_handlers = 2;
    o.interval = Duration::from_millis(10);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.num_total_jobs = Some(jobs);
    let worker = new_worker(store, Writes, o).unwrap();
    tokio::time::timeout(Duration::from_secs(60), worker.run())
        .await
        .expect("the attempts ran");
}

async fn failure(db: &Db, id: i64) -> String {
    db.scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await
}

async fn a_result_holding_nul_fails_its_job(handling: Handling) {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.results = true;
            c.error_history = true;
        },
        &[],
    )
    .await;
    let bad = db.enqueue(1, json!({ "nul": true })).await[0];
    let good = db.enqueue(2, json!({ "result": { "rows": 3 } })).await;
    let failing = db.enqueue(1, json!({ "fail_with_nul": true })).await[0];
    let table = db
        .table_with(|t| {
            t.result_column = Some("result".into());
            t.error_history_column = Some("errors".into());
        })
        .await;
    let mut o = db.options();
    o.handling = handling;
    run(db.store_on(&table, o).await, 4).await;
    // A failure message keeps its NUL visible, in the history too.
    assert_eq!(db.state(failing).await, "failed", "{handling:?}");
    assert_eq!(failure(&db, failing).await, "bad a\\0b");
    let entry: String = db
        .scalar(
            "SELECT errors->0->>'message' FROM jobs WHERE id = $1",
            failing,
        )
        .await;
    assert_eq!(entry, "bad a\\0b");
    assert_eq!(
        db.state(bad).await,
        "failed",
        "{handling:?}: not left processing"
    );
    let message = failure(&db, bad).await;
    assert!(
        message.contains("the job's result (at $.s) holds a NUL character (U+0000)"),
        "{handling:?}: {message}"
    );
    for id in good {
        assert_eq!(db.state(id).await, "completed", "{handling:?}");
        let result: Value = db.scalar("SELECT result FROM jobs WHERE id = $1", id).await;
        assert_eq!(result, json!({ "rows": 3 }));
    }
}

#[tokio::test]
async fn a_result_holding_nul_fails_its_job_in_heartbeat_handling() {
    a_result_holding_nul_fails_its_job(Handling::Heartbeat).await;
}

#[tokio::test]
async fn a_result_holding_nul_fails_its_job_in_transactional_handling() {
    a_result_holding_nul_fails_its_job(Handling::Transactional).await;
}

async fn a_payload_to_retry_with_holding_nul_fails_its_job(handling: Handling) {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({ "retry_with": ["ok", "fine"] })).await[0];
    let bad = db
        .enqueue(1, json!({ "retry_with": ["ok"], "nul": true }))
        .await[0];
    let mut o = db.options();
    o.handling = handling;
    o.max_num_retries = 3;
    o.retry = dbworker::RetryPolicy::fixed(Duration::from_secs(3600));
    let table = db
        .table_with(|t| t.payload_column = Some("payload".into()))
        .await;
    run(db.store_on(&table, o).await, 2).await;
    assert_eq!(
        db.state(bad).await,
        "failed",
        "{handling:?}: not left processing"
    );
    let message = failure(&db, bad).await;
    assert!(
        message.starts_with(
            "two items left; not retried: the payload to retry with (at $.items[1]) holds a NUL"
        ),
        "{handling:?}: {message}"
    );
    let kept: Value = db
        .scalar("SELECT payload FROM jobs WHERE id = $1", bad)
        .await;
    assert_eq!(
        kept,
        json!({ "retry_with": ["ok"], "nul": true }),
        "the payload it had"
    );
    // The other one is retried with its new payload.
    assert_eq!(db.state(id).await, "errored", "{handling:?}");
    let rewritten: Value = db
        .scalar("SELECT payload FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(rewritten, json!({ "items": ["ok", "fine"] }));
}

#[tokio::test]
async fn a_payload_to_retry_with_holding_nul_fails_its_job_in_heartbeat_handling() {
    a_payload_to_retry_with_holding_nul_fails_its_job(Handling::Heartbeat).await;
}

#[tokio::test]
async fn a_payload_to_retry_with_holding_nul_fails_its_job_in_transactional_handling() {
    a_payload_to_retry_with_holding_nul_fails_its_job(Handling::Transactional).await;
}

#[tokio::test]
async fn an_enqueue_holding_nul_is_refused_naming_the_field() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.keys = true;
            c.queue = true;
            c.kind = true;
            c.flags = true;
        },
        &[],
    )
    .await;
    let table = db
        .table_with(|t| {
            t.key_column = Some("job_key".into());
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.flags_column = Some("flags".into());
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let fine = || NewJob::new().json("payload", json!({ "n": 1 }));
    let cases = [
        (
            NewJob::new().json("payload", json!({ "to": ["x", { "s": "a\u{0}b" }] })),
            "the job's column `payload` (at $.to[1].s) holds a NUL character",
        ),
        (
            fine().set("payload", "a\u{0}"),
            "the job's column `payload` holds a NUL",
        ),
        (
            fine().queue("q\u{0}"),
            r#"the job's queue "q\0" holds a NUL"#,
        ),
        (fine().kind("k\u{0}"), r#"the job's kind "k\0" holds a NUL"#),
        (
            fine().key("k\u{0}", dbworker::KeyMode::Replace),
            r#"the job's key "k\0" holds a NUL"#,
        ),
        (
            fine().flags(["ok", "f\u{0}"]),
            r#"the job's flag "f\0" holds a NUL"#,
        ),
    ];
    for (job, expected) in &cases {
        let err = enqueuer.enqueue(job).await.unwrap_err().to_string();
        assert!(err.contains(expected), "{expected}: {err}");
        let err = enqueuer
            .enqueue_many(&[fine(), job.clone()])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "many: {expected}: {err}");
    }
    let err = enqueuer
        .enqueue_copy(&[fine(), cases[0].0.clone()])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(cases[0].1), "copy: {err}");
    let workflow = Workflow::new().task(Task::new("t\0", fine()));
    let err = workflow.check().unwrap_err().to_string();
    assert!(err.contains(r#"task name "t\0" holds a NUL"#), "{err}");
    assert_eq!(db.count("queued").await, 0, "nothing was stored");
    enqueuer.enqueue(&fine()).await.unwrap();
    assert_eq!(db.count("queued").await, 1);
}

#[tokio::test]
async fn a_forbidden_flag_holding_nul_is_refused_or_left_out_and_claims_go_on() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.flags = true;
            c.kind = true;
        },
        &[],
    )
    .await;
    let ids = db.enqueue(3, json!({})).await;
    db.execute(&format!(
        "UPDATE jobs SET flags = ARRAY['slow'] WHERE id = {}; UPDATE jobs SET kind = 'email' WHERE id <> {0}",
        ids[0]
    ))
    .await;
    let table = db
        .table_with(|t| t.flags_column = Some("flags".into()))
        .await;
    let with_flags = |flags: ForbiddenFlags| {
        let mut o = db.options();
        o.claim.forbidden_flags = Some(flags);
        o
    };
    let err = DbStore::<Job>::new(
        &db.pool,
        &table,
        with_flags(ForbiddenFlags::fixed(["slow", "a\0b"])),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("forbidden_flags") && err.contains(r#"flag "a\0b" holds a NUL"#),
        "{err}"
    );
    // A callback's answer cannot be checked up front: the flag is left out
    // (no job can carry it), and the claims go on skipping the others.
    let asked = ForbiddenFlags::callback(|| async { vec!["a\0b".to_owned(), "slow".to_owned()] });
    let store = DbStore::<Job>::new(&db.pool, &table, with_flags(asked))
        .await
        .unwrap();
    // So do kinds (a registry's restriction) holding one.
    let kinds = DbConditions::new().column_in("j.kind", &["k\0".to_owned(), "email".to_owned()]);
    let jobs = store.dequeue("host", &kinds, 5).await.unwrap();
    let mut claimed: Vec<i64> = jobs.iter().map(|j| j.record().id).collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ids[1..], "every job but the flagged one");
}

#[tokio::test]
async fn a_queue_or_hostname_holding_nul_is_refused_naming_it() {
    let db = Db::new().await;
    let store = db.store(Handling::Heartbeat).await;
    // Fit for the store, so the NUL is all that is wrong.
    let worker = |name: &str| {
        let mut o = WorkerOptions::new(name);
        o.heartbeat_interval = Duration::from_millis(100);
        o.heartbeat_failure_limit = Some(Duration::from_secs(2));
        o
    };
    let options = QueueWorkersOptions::new(worker("q"))
        .queue("mail", 1)
        .queue("a\0b", 1);
    let err = QueueWorkers::new(store.clone(), Completes, options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`queues`") && err.contains(r#"queue "a\0b" holds a NUL"#),
        "{err}"
    );
    let mut o = worker("w");
    o.hostname = Some("host\0".into());
    let err = new_worker(store, Completes, o).unwrap_err().to_string();
    assert!(
        err.contains("`hostname`") && err.contains("NUL character"),
        "{err}"
    );
}
