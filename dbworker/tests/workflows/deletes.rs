//! Deleted upstream jobs: a job deleted before it completed can never
//! complete, so each of its dependents is canceled for good, naming it,
//! whatever state the delete finds the dependent in (waiting, canceled by
//! another upstream's failure, requeued by an operator), however the row goes
//! (`Admin`, plain SQL, retention), and no edge is left pointing at it.

use std::time::Duration;

use dbworker::NewJob;
use dbworker::admin::{Admin, BulkAction};
use dbworker::maintenance::{PurgeOptions, Purger};

use crate::common::Db;
use crate::workflows::{after, blocked_by, finish, set_up, table};

/// Edges to an upstream row that no longer exists.
async fn dangling(db: &Db) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs_deps AS e WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = e.depends_on)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn message(db: &Db, id: i64) -> Option<String> {
    db.scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await
}

/// `d` canceled for good by the delete of `upstream`: no `blocked_by` (so no
/// retry brings it back), the message naming the deleted job.
async fn canceled_for_good(db: &Db, d: i64, upstream: i64, why: &str) {
    assert_eq!(db.state(d).await, "canceled", "{why}");
    assert_eq!(blocked_by(db, d).await, None, "{why}");
    assert_eq!(
        message(db, d).await.as_deref(),
        Some(format!("upstream job {upstream} was deleted").as_str()),
        "{why}"
    );
}

/// A dependent canceled by one upstream's failure, whose other upstream is
/// then deleted unfinished, stays canceled when the failed one is retried or
/// completed by hand: the deleted one never ran, exactly as when the
/// dependent was still waiting at the delete. Before, the delete left it
/// alone (it was not `pending`) and took its edge, and the retry brought it
/// back waiting for the failed upstream only, to run without the deleted one.
#[tokio::test]
async fn a_deleted_upstream_keeps_a_dependent_another_failure_canceled_from_coming_back() {
    let (db, workflows) = set_up().await;
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    for by_complete in [false, true] {
        let up = db.enqueue(2, serde_json::json!({})).await;
        let (failed, deleted) = (up[0], up[1]);
        let d = after(&workflows, &[failed, deleted]).await;
        finish(&db, failed, "failed").await;
        assert_eq!(blocked_by(&db, d).await, Some(failed));
        assert_eq!(
            admin
                .act_on_ids(&[deleted], &BulkAction::Delete)
                .await
                .unwrap(),
            1
        );
        canceled_for_good(&db, d, deleted, "at the delete").await;
        if by_complete {
            let done = admin.act_on_ids(&[failed], &BulkAction::Complete).await;
            assert_eq!(done.unwrap(), 1);
        } else {
            assert!(admin.requeue(failed).await.unwrap());
            finish(&db, failed, "completed").await;
        }
        canceled_for_good(&db, d, deleted, &format!("complete: {by_complete}")).await;
        assert_eq!(dangling(&db).await, 0);
    }
}

/// A failed or canceled upstream deleted (by `Admin` or plain SQL) while an
/// operator's requeue has its dependent waiting for it again: the dependent
/// is canceled, naming it, not left `pending` for good on an edge to a row
/// that is gone; a dependent still canceled by it is canceled for good. Before,
/// the delete of a finished row fired nothing.
#[tokio::test]
async fn deleting_a_failed_or_canceled_upstream_cancels_a_requeued_dependent() {
    let (db, workflows) = set_up().await;
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    for (outcome, by_sql) in [("failed", false), ("canceled", true)] {
        let u = db.enqueue(1, serde_json::json!({})).await[0];
        let requeued = after(&workflows, &[u]).await;
        let left = after(&workflows, &[u]).await;
        finish(&db, u, outcome).await;
        assert_eq!(blocked_by(&db, requeued).await, Some(u));
        assert!(admin.requeue(requeued).await.unwrap());
        assert_eq!(db.state(requeued).await, "pending", "waits for {u} again");
        if by_sql {
            db.execute(&format!("DELETE FROM jobs WHERE id = {u}"))
                .await;
        } else {
            let deleted = admin.act_on_ids(&[u], &BulkAction::Delete).await;
            assert_eq!(deleted.unwrap(), 1);
        }
        canceled_for_good(&db, requeued, u, outcome).await;
        canceled_for_good(&db, left, u, outcome).await;
        assert_eq!(dangling(&db).await, 0, "{outcome}");
    }
}

/// Retention deletes a failed upstream once its age passes, and its
/// dependents canceled by that failure with it (finished as long ago) or
/// later: one it outlives is canceled for good, naming it, with no edge left
/// to the purged row, and no retry of another upstream brings it back. A
/// dependent an operator requeued (waiting for the failed job again) keeps
/// the failed job from retention, as any unfinished dependent does.
#[tokio::test]
async fn retention_of_a_failed_upstream_cancels_its_dependents_for_good() {
    let (db, workflows) = set_up().await;
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    let up = db.enqueue(3, serde_json::json!({})).await;
    let (old, other, kept) = (up[0], up[1], up[2]);
    let d = after(&workflows, &[old, other]).await;
    let waits = after(&workflows, &[kept]).await;
    finish(&db, old, "failed").await;
    finish(&db, kept, "failed").await;
    assert_eq!(blocked_by(&db, d).await, Some(old));
    assert!(admin.requeue(waits).await.unwrap());
    db.execute(&format!(
        "UPDATE jobs SET finished_at = now() - interval '31 days' WHERE id IN ({old}, {kept})"
    ))
    .await;
    let purger = Purger::new(&db.pool, &table(&db).await, PurgeOptions::new())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 1, "{old} only");
    assert_eq!(db.state(kept).await, "failed", "{waits} waits for it");
    canceled_for_good(&db, d, old, "purged").await;
    assert_eq!(dangling(&db).await, 0);
    finish(&db, other, "failed").await;
    assert!(admin.requeue(other).await.unwrap());
    finish(&db, other, "completed").await;
    canceled_for_good(&db, d, old, "after the other's retry").await;
}

/// `<table>_wait_for` (and `NewJob::after`) racing the delete of an upstream
/// job: the call waits for the delete's commit and then refuses the job as
/// it refuses any missing upstream, instead of queueing it to run without
/// the deleted one. Before, the SQL function counted the upstream rows
/// before locking them, found this one, and then skipped it once locked.
#[tokio::test]
async fn a_wait_racing_the_delete_of_its_upstream_is_refused() {
    let (db, workflows) = set_up().await;
    for by_function in [true, false] {
        let u = db.enqueue(1, serde_json::json!({})).await[0];
        let mut delete = db.pool.begin().await.unwrap();
        sqlx::query("DELETE FROM jobs WHERE id = $1")
            .bind(u)
            .execute(&mut *delete)
            .await
            .unwrap();
        let (pool, enqueuer) = (db.pool.clone(), workflows.enqueuer().clone());
        let wait = tokio::spawn(async move {
            if !by_function {
                return enqueuer
                    .enqueue(&NewJob::new().after(vec![u]))
                    .await
                    .map(|e| format!("{e:?}"))
                    .map_err(|e| e.to_string());
            }
            let mut tx = pool.begin().await.unwrap();
            let id: i64 = sqlx::query_scalar("INSERT INTO jobs DEFAULT VALUES RETURNING id")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            let state = sqlx::query_scalar::<_, String>("SELECT jobs_wait_for($1, ARRAY[$2])")
                .bind(id)
                .bind(u)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.unwrap();
            Ok(state)
        });
        // Time for the call to reach the lock the delete holds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        delete.commit().await.unwrap();
        let err = wait.await.unwrap().unwrap_err();
        assert!(
            err.contains("does not exist"),
            "function: {by_function}: {err}"
        );
        assert_eq!(dangling(&db).await, 0);
    }
}

/// The delete of one upstream racing the retry of another, which its failure
/// had canceled the dependent for, in either commit order: the dependent
/// ends canceled for good by the delete. Each locks the dependent before it
/// looks, so the second to get the lock sees what the first committed.
#[tokio::test]
async fn a_delete_racing_another_upstreams_retry_cancels_the_dependent_for_good() {
    let (db, workflows) = set_up().await;
    for delete_first in [true, false] {
        let up = db.enqueue(2, serde_json::json!({})).await;
        let (failed, deleted) = (up[0], up[1]);
        let d = after(&workflows, &[failed, deleted]).await;
        finish(&db, failed, "failed").await;
        let mut first = db.pool.begin().await.unwrap();
        let (retry, delete) = (
            format!("UPDATE jobs SET state = 'queued', finished_at = NULL WHERE id = {failed}"),
            format!("DELETE FROM jobs WHERE id = {deleted}"),
        );
        let (one, two) = if delete_first {
            (delete, retry)
        } else {
            (retry, delete)
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(one))
            .execute(&mut *first)
            .await
            .unwrap();
        let pool = db.pool.clone();
        let second = tokio::spawn(async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(two))
                .execute(&pool)
                .await
                .unwrap();
        });
        // Time for the second to reach the dependent's lock the first holds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "delete first: {delete_first}");
        first.commit().await.unwrap();
        second.await.unwrap();
        let why = format!("delete first: {delete_first}");
        canceled_for_good(&db, d, deleted, &why).await;
        finish(&db, failed, "completed").await;
        canceled_for_good(&db, d, deleted, &why).await;
        assert_eq!(dangling(&db).await, 0);
    }
}
