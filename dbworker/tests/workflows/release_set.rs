//! The set-wise release of completions (`<table>_dbworker_release_set`, a
//! statement-level trigger): the paths the races in `workflows.rs` do not
//! reach, its refusal outside READ COMMITTED (and the row trigger's, for a
//! failure an edge ignores), and what it leaves alone.

use std::time::Duration;

use dbworker::workflow::Workflows;
use dbworker::{DependencyPolicy, NewJob};

use super::workflows::{begin_impatient, complete_in, set_up};
use crate::common::Db;

/// Each `DELETE` of edges sleeps at its end, inside the release: two
/// completions started together have both deleted their edges before either
/// looks at the other's.
const SLOW_EDGE_DELETES: &str = r#"
CREATE FUNCTION slow_edge_deletes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.5);
    RETURN NULL;
END
$$;
CREATE TRIGGER slow_edge_deletes AFTER DELETE ON jobs_deps
    FOR EACH STATEMENT EXECUTE FUNCTION slow_edge_deletes();
"#;

/// The row trigger as `dbworker migration --workflows` made it before
/// completions were released set-wise: it fired for completions too.
const OLDER_ROW_TRIGGER: &str = r#"
CREATE OR REPLACE TRIGGER "jobs_dbworker_release" AFTER UPDATE OF "state" ON jobs
    FOR EACH ROW WHEN (NEW."has_dependents" AND OLD."state" IS DISTINCT FROM NEW."state"
        AND (NEW."state" IN ('completed', 'failed', 'canceled') OR OLD."state" IN ('failed', 'canceled')))
    EXECUTE FUNCTION "jobs_dbworker_release"();
"#;

/// `n` queued jobs and one dependent waiting for them all.
async fn upstreams_and_sink(db: &Db, workflows: &Workflows, n: usize) -> (Vec<i64>, i64) {
    let up = db.enqueue(n, serde_json::json!({})).await;
    let after = NewJob::new().after(up.clone());
    let sink = workflows.enqueuer().enqueue(&after).await.unwrap().id();
    (up, sink)
}

#[tokio::test]
async fn the_last_two_completions_deleting_at_once_take_turns_on_the_dependent() {
    let (db, workflows) = set_up().await;
    db.execute(SLOW_EDGE_DELETES).await;
    for round in 0..2 {
        let (up, sink) = upstreams_and_sink(&db, &workflows, 2).await;
        // Both delete, then each finds the other's edge being deleted (the
        // probe skips it): the last step, `FOR UPDATE` on the dependent and a
        // check after it, is the only one left. The first to lock returns
        // while the other waits for its commit; without the lock both would
        // return, each still seeing the other's edge, and release nothing.
        let (done, mut returned) = tokio::sync::mpsc::unbounded_channel();
        let (go, _) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for &id in &up {
            let (pool, done, mut go) = (db.pool.clone(), done.clone(), go.subscribe());
            tasks.push(tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                complete_in(&mut tx, id).await;
                done.send(id).unwrap();
                go.wait_for(|go| *go).await.unwrap();
                tx.commit().await.unwrap();
            }));
        }
        let first = tokio::time::timeout(Duration::from_secs(10), returned.recv())
            .await
            .expect("a completion returns")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            returned.try_recv().is_err(),
            "round {round}: the other completion waits for {first}'s lock on the dependent"
        );
        go.send(true).unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            db.state(sink).await,
            "queued",
            "round {round}: released, not stranded"
        );
    }
}

/// Moves `up` to `state` in REPEATABLE READ and in SERIALIZABLE: each write
/// must fail naming the job and roll back, leaving `sink` pending.
async fn refused_outside_read_committed(db: &Db, up: i64, state: &str, sink: i64) {
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {level}"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        let err = sqlx::query("UPDATE jobs SET state = $2 WHERE id = $1")
            .bind(up)
            .bind(state)
            .execute(&mut *tx)
            .await
            .expect_err("refused");
        let message = err.to_string();
        assert!(
            message.contains(&format!("releasing the dependents of job {up}"))
                && message.contains("needs READ COMMITTED"),
            "{level}: {message}"
        );
        tx.rollback().await.unwrap();
        assert_eq!(db.state(up).await, "queued", "{level}: rolled back");
        assert_eq!(db.state(sink).await, "pending");
    }
}

#[tokio::test]
async fn a_release_outside_read_committed_is_refused_and_rolled_back() {
    let (db, workflows) = set_up().await;
    let (up, sink) = upstreams_and_sink(&db, &workflows, 1).await;
    refused_outside_read_committed(&db, up[0], "completed", sink).await;
    complete_in(&mut db.pool.acquire().await.unwrap(), up[0]).await;
    assert_eq!(db.state(sink).await, "queued");
}

#[tokio::test]
async fn a_failure_an_edge_ignores_is_refused_outside_read_committed_too() {
    // A failure goes through the row trigger, which releases a dependent
    // whose edge ignores it by the same protocol, and refuses the same way.
    let (db, workflows) = set_up().await;
    let up = db.enqueue(1, serde_json::json!({})).await;
    let after = NewJob::new().after_with(up.clone(), DependencyPolicy::Ignore);
    let sink = workflows.enqueuer().enqueue(&after).await.unwrap().id();
    refused_outside_read_committed(&db, up[0], "failed", sink).await;
    sqlx::query("UPDATE jobs SET state = 'failed' WHERE id = $1")
        .bind(up[0])
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(db.state(sink).await, "queued", "released in READ COMMITTED");
}

#[tokio::test]
async fn updating_a_job_that_was_already_completed_leaves_the_edges_alone() {
    let (db, workflows) = set_up().await;
    let (up, sink) = upstreams_and_sink(&db, &workflows, 1).await;
    complete_in(&mut db.pool.acquire().await.unwrap(), up[0]).await;
    assert_eq!(db.state(sink).await, "queued");
    // An operator's UPDATE of a finished job's other columns (or a role
    // without rights on the edge table) must not reach the edge table: with
    // it locked, such an UPDATE neither waits nor fails.
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE jobs_deps IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut tx = begin_impatient(&db).await;
    sqlx::query("UPDATE jobs SET state = 'completed', worker_hostname = 'by hand' WHERE id = $1")
        .bind(up[0])
        .execute(&mut *tx)
        .await
        .expect("no wait for the edge table");
    tx.commit().await.unwrap();
    holder.rollback().await.unwrap();
}

#[tokio::test]
async fn while_the_older_row_trigger_still_fires_for_completions_dependents_are_released() {
    // The migration run again outside a transaction on an older table: the
    // statement trigger and the new row function exist before the row
    // trigger is narrowed, so for a moment a completion fires both (the row
    // trigger first). The row function must release, not cancel, and the
    // statement trigger then find nothing left to do.
    let (db, workflows) = set_up().await;
    db.execute(OLDER_ROW_TRIGGER).await;
    let mut conn = db.pool.acquire().await.unwrap();
    // One at a time, then both in one statement.
    let (up, sink) = upstreams_and_sink(&db, &workflows, 2).await;
    complete_in(&mut conn, up[0]).await;
    assert_eq!(db.state(sink).await, "pending", "one edge left");
    complete_in(&mut conn, up[1]).await;
    assert_eq!(
        db.state(sink).await,
        "queued",
        "released by its last upstream"
    );
    let (up, sink) = upstreams_and_sink(&db, &workflows, 2).await;
    sqlx::query("UPDATE jobs SET state = 'completed' WHERE id = ANY($1)")
        .bind(&up)
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(db.state(sink).await, "queued", "released by one statement");
    let edges: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(edges, 0, "every satisfied edge deleted");
}
