//! Marks that Postgres rolls back as a deadlock victim or for a
//! serialization failure are written again — grouped completions in
//! heartbeat handling, and a failure written on the pool after the handler's
//! transaction rolled back — so the jobs end with their outcome, each
//! handled once, without waiting for the resetter.

use crate::common;

use std::time::Duration;

use serde_json::json;
use workerutil::testing::{finished, wait_for};
use workerutil::{Outcome, StopReason, WorkerOptions};

use dbworker::{DbJob, DbStore, Handling};
use workerutil::{Handler, HandlerError, JobContext};

use common::{Db, Job};

/// Fails every job for good.
struct Fails;
impl Handler<DbStore<Job>> for Fails {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::non_retryable("malformed payload"))
    }
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = 4;
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o
}

/// A trigger raises a deadlock, then a serialization failure, then another
/// deadlock, on the first three completions the server sees (a sequence
/// counts them: it does not roll back with the statement).
#[tokio::test]
async fn a_group_rolled_back_as_a_deadlock_victim_is_written_again() {
    let db = Db::new().await;
    db.execute(
        "CREATE SEQUENCE injected;
         CREATE FUNCTION roll_back_three() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE n bigint := nextval('injected');
         BEGIN
             IF n IN (1, 3) THEN
                 RAISE EXCEPTION 'injected deadlock' USING ERRCODE = 'deadlock_detected';
             ELSIF n = 2 THEN
                 RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER roll_back_three BEFORE UPDATE OF state ON jobs
             FOR EACH ROW WHEN (NEW.state = 'completed') EXECUTE FUNCTION roll_back_three();",
    )
    .await;
    let ids = db.enqueue(20, json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let summary = dbworker::new_worker(store.clone(), common::Completes, options("transient"))
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(summary.reason, StopReason::QueueEmpty);
    assert_eq!(summary.dequeued, ids.len() as u64, "each job claimed once");
    assert_eq!(db.count("completed").await, 20, "none left processing");
    let fired: i64 = sqlx::query_scalar("SELECT last_value FROM injected")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(fired > 3, "the three rollbacks happened ({fired} firings)");
    store.close().await;
}

/// An error that does not pass (here a check the trigger raises) is not
/// written again and again: the completion fails at once, and the job is
/// marked errored with the trigger's reason (failed here: no retries), as a
/// transactional completion refused at its commit is; it is not left
/// `processing` for the resetter, which would end it as "died too many
/// times" without the reason.
#[tokio::test]
async fn an_error_that_does_not_pass_is_not_written_again() {
    let db = Db::new().await;
    db.execute(
        "CREATE SEQUENCE injected;
         CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM nextval('injected');
             RAISE EXCEPTION 'refused by the application';
         END $$;
         CREATE TRIGGER refuse BEFORE UPDATE OF state ON jobs
             FOR EACH ROW WHEN (NEW.state = 'completed') EXECUTE FUNCTION refuse();",
    )
    .await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.max_num_retries = 0;
    let store = db.store_on(&db.table().await, o).await;
    let worker =
        dbworker::new_worker(store.clone(), common::Completes, options("refused")).unwrap();
    let mut events = worker.subscribe();
    let summary = worker.run_until_empty().await;
    assert_eq!(summary.dequeued, 1);
    assert_eq!(db.state(id).await, "failed");
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await;
    assert!(message.contains("refused by the application"), "{message}");
    let (outcome, marked) = wait_for(&mut events, finished(id)).await;
    assert!(matches!(outcome, Outcome::Errored(_)), "{outcome:?}");
    assert!(marked);
    let fired: i64 = sqlx::query_scalar("SELECT last_value FROM injected")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(fired, 1, "written once");
    store.close().await;
}

/// In transactional handling a failure is written on the pool once the
/// handler's transaction rolled back; a deadlock there is written again too.
#[tokio::test]
async fn a_failure_written_after_the_rollback_is_written_again() {
    let db = Db::new().await;
    db.execute(
        "CREATE SEQUENCE injected;
         CREATE FUNCTION roll_back_two() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('injected') <= 2 THEN
                 RAISE EXCEPTION 'injected deadlock' USING ERRCODE = 'deadlock_detected';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER roll_back_two BEFORE UPDATE OF state ON jobs
             FOR EACH ROW WHEN (NEW.state = 'failed') EXECUTE FUNCTION roll_back_two();",
    )
    .await;
    db.enqueue(3, json!({})).await;
    let store = db.store(Handling::Transactional).await;
    let summary = dbworker::new_worker(store.clone(), Fails, options("fails"))
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(summary.dequeued, 3, "each job claimed once");
    assert_eq!(db.count("failed").await, 3, "none left processing");
    store.close().await;
}
