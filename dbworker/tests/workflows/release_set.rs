//! The set-wise release of completions (`<table>_dbworker_release_set`, a
//! statement-level trigger): the paths the races in `workflows.rs` do not
//! reach, its refusal outside READ COMMITTED, and what it leaves alone.

use std::time::Duration;

use dbworker::NewJob;
use dbworker::workflow::Workflows;

use super::workflows::{complete_in, set_up};
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

#[tokio::test]
async fn a_release_outside_read_committed_is_refused_and_rolled_back() {
    let (db, workflows) = set_up().await;
    let (up, sink) = upstreams_and_sink(&db, &workflows, 1).await;
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {level}"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        let err = sqlx::query("UPDATE jobs SET state = 'completed' WHERE id = $1")
            .bind(up[0])
            .execute(&mut *tx)
            .await
            .expect_err("refused");
        let message = err.to_string();
        assert!(
            message.contains(&format!("releasing the dependents of job {}", up[0]))
                && message.contains("needs READ COMMITTED"),
            "{level}: {message}"
        );
        tx.rollback().await.unwrap();
        assert_eq!(db.state(up[0]).await, "queued", "{level}: rolled back");
        assert_eq!(db.state(sink).await, "pending");
    }
    complete_in(&mut db.pool.acquire().await.unwrap(), up[0]).await;
    assert_eq!(db.state(sink).await, "queued");
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
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '1s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET state = 'completed', worker_hostname = 'by hand' WHERE id = $1")
        .bind(up[0])
        .execute(&mut *tx)
        .await
        .expect("no wait for the edge table");
    tx.commit().await.unwrap();
    holder.rollback().await.unwrap();
}
