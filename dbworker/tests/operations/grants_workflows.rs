//! Least privilege with workflows: the release trigger runs as the role whose
//! write finishes a job, so a worker also needs the dependency table's grants
//! (each shown needed by the trigger itself), and enqueueing workflows needs
//! the edges' INSERT and the workflow id sequence. As in grants.rs: exactly
//! the documented grants work, and each one missing is named at start-up.

use crate::common;
use crate::fixtures::grants as roles;

use std::collections::HashMap;

use dbworker::admin::Admin;
use dbworker::ddl::workflows_sql;
use dbworker::maintenance::{PurgeOptions, Purger};
use dbworker::workflow::{Task, Workflow, Workflows};
use dbworker::{DbStore, DependencyPolicy, Enqueued, Enqueuer, JobTable, KeyMode, NewJob};
use sqlx::PgPool;

use common::Db;
use roles::{Grants, complete_jobs, drop_role, each_grant_is_needed, role_with};

const WORKFLOW_WORKER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_deps",
    "UPDATE ON jobs_deps",
    "DELETE ON jobs_deps",
]);
const WORKFLOW_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_deps",
    "INSERT ON jobs_deps",
    "UPDATE ON jobs_deps",
    "DELETE ON jobs_deps",
    "USAGE ON SEQUENCE jobs_workflow_seq",
]);

async fn set_up() -> Db {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db
}

async fn table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    let mut o = Db::table_options();
    o.workflows = true;
    JobTable::new(pool, o).await
}

fn two_steps() -> Workflow {
    Workflow::new()
        .task(Task::new("first", NewJob::new()))
        .task(Task::new("second", NewJob::new()).after(["first"]))
}

#[tokio::test]
async fn a_workflow_worker_releases_dependents_with_the_dependency_grants() {
    let db = set_up().await;
    let owner = Workflows::new(&db.pool, &table(&db.pool).await.unwrap())
        .await
        .unwrap();
    let run = owner.enqueue(&two_steps()).await.unwrap();
    let (name, pool) = role_with(&db, WORKFLOW_WORKER.0).await;
    complete_jobs(
        &pool,
        &table(&pool).await.unwrap(),
        Db::options_for_tests(),
        2,
    )
    .await;
    for task in ["first", "second"] {
        assert_eq!(
            db.state(run.id_of(task).unwrap()).await,
            "completed",
            "{task}"
        );
    }
    drop_role(&db, pool, &name).await;

    // Each dependency grant is one the trigger really uses: finishing an
    // upstream job as a role without it fails in the trigger.
    for missing in [
        "SELECT ON jobs_deps",
        "UPDATE ON jobs_deps",
        "DELETE ON jobs_deps",
    ] {
        let run = owner.enqueue(&two_steps()).await.unwrap();
        let others: Vec<&str> = WORKFLOW_WORKER
            .0
            .iter()
            .copied()
            .filter(|g| *g != missing)
            .collect();
        let (name, pool) = role_with(&db, &others).await;
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE \"{name}\"")))
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = sqlx::query("UPDATE jobs SET state = 'completed' WHERE id = $1")
            .bind(run.id_of("first").unwrap())
            .execute(&mut *tx)
            .await
            .expect_err(&format!("finished an upstream job without {missing}"))
            .to_string();
        assert!(
            err.contains("permission denied for table jobs_deps"),
            "{missing}: {err}"
        );
        drop(tx);
        drop_role(&db, pool, &name).await;
    }

    each_grant_is_needed(&db, &WORKFLOW_WORKER, |pool| async move {
        DbStore::<common::Job>::new(&pool, &table(&pool).await?, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_workflow_enqueuer_needs_the_edges_and_the_workflow_sequence() {
    let db = set_up().await;
    let (name, pool) = role_with(&db, WORKFLOW_ENQUEUER.0).await;
    let workflows = Workflows::new(&pool, &table(&pool).await.unwrap())
        .await
        .unwrap();
    let run = workflows.enqueue(&two_steps()).await.unwrap();
    assert_eq!(db.state(run.id_of("second").unwrap()).await, "pending");
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &WORKFLOW_ENQUEUER, |pool| async move {
        Workflows::new(&pool, &table(&pool).await?).await?;
        Ok(())
    })
    .await;
}

// `NewJob::after` through a plain enqueuer: what the workflow enqueuer has
// but the workflow sequence, checked at the first job that waits.
const AFTER_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_deps",
    "INSERT ON jobs_deps",
    "UPDATE ON jobs_deps",
    "DELETE ON jobs_deps",
]);

#[tokio::test]
async fn a_job_that_waits_is_enqueued_with_the_edges_grants_named_at_its_first_enqueue() {
    let db = set_up().await;
    let upstream = db.enqueue(1, serde_json::json!({})).await[0];
    let (name, pool) = role_with(&db, AFTER_ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(&pool, &table(&pool).await.unwrap())
        .await
        .unwrap();
    let id = enqueuer
        .enqueue(&NewJob::new().after([upstream]))
        .await
        .unwrap()
        .id();
    assert_eq!(db.state(id).await, "pending");
    // Inside the caller's transaction too, on its connection.
    let mut tx = pool.begin().await.unwrap();
    enqueuer
        .enqueue_in(&mut tx, &NewJob::new().after([upstream]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("pending").await, 2);
    drop_role(&db, pool, &name).await;

    // A plain enqueue needs none of it; the first job that waits names what
    // is missing.
    each_grant_is_needed(&db, &AFTER_ENQUEUER, |pool| async move {
        let enqueuer = Enqueuer::new(&pool, &table(&pool).await?).await?;
        enqueuer.enqueue(&NewJob::new().after([upstream])).await?;
        Ok(())
    })
    .await;
    let (name, pool) = role_with(&db, &AFTER_ENQUEUER.0[..4]).await;
    let enqueuer = Enqueuer::new(&pool, &table(&pool).await.unwrap())
        .await
        .unwrap();
    enqueuer.enqueue(&NewJob::new()).await.unwrap();
    drop_role(&db, pool, &name).await;
}

// The purger's grants, and the release trigger's on the edges: deleting a
// failed or canceled job others waited for runs it as the purger.
const WORKFLOW_PURGER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "DELETE ON jobs",
    "SELECT ON jobs_deps",
    "UPDATE ON jobs_deps",
    "DELETE ON jobs_deps",
]);

/// A purger of a table with workflows purges a failed upstream job (its
/// dependent canceled for good by the release trigger, as the purger) with
/// exactly its documented grants, and names each one missing at start-up.
/// Each dependency grant is one the trigger uses when such a job is deleted:
/// a dependent requeued to wait for it is canceled, and that cascades to a
/// job waiting for the dependent under `ignore_canceled`, which is released.
#[tokio::test]
async fn a_workflow_purger_purges_a_failed_upstream_with_the_dependency_grants() {
    let db = set_up().await;
    let owner = Workflows::new(&db.pool, &table(&db.pool).await.unwrap())
        .await
        .unwrap();
    let after = |ids: Vec<i64>, policy: DependencyPolicy| {
        let enqueuer = owner.enqueuer().clone();
        async move {
            let job = NewJob::new().after_with(ids, policy);
            enqueuer.enqueue(&job).await.unwrap().id()
        }
    };
    let up = db.enqueue(2, serde_json::json!({})).await;
    let (old, requeued_for) = (up[0], up[1]);
    let canceled = after(vec![old], DependencyPolicy::Cancel).await;
    let waits = after(vec![requeued_for], DependencyPolicy::Cancel).await;
    db.execute(&format!(
        "UPDATE jobs SET state = 'failed', finished_at = now() - interval '31 days' WHERE id = {old};
         UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = {requeued_for}"
    ))
    .await;
    let admin = Admin::new(&db.pool, &table(&db.pool).await.unwrap())
        .await
        .unwrap();
    assert!(admin.requeue(waits).await.unwrap());
    let below = after(vec![waits], DependencyPolicy::IgnoreCanceled).await;
    assert_eq!(db.state(below).await, "pending");

    let (name, pool) = role_with(&db, WORKFLOW_PURGER.0).await;
    let purger = Purger::new(&pool, &table(&pool).await.unwrap(), PurgeOptions::new())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 1, "{old}");
    assert_eq!(db.state(canceled).await, "canceled");
    let blocked: Option<i64> = db
        .scalar("SELECT blocked_by FROM jobs WHERE id = $1", canceled)
        .await;
    assert_eq!(blocked, None, "canceled for good");
    drop_role(&db, pool, &name).await;

    let delete = format!("DELETE FROM jobs WHERE id = {requeued_for}");
    for missing in [
        "SELECT ON jobs_deps",
        "UPDATE ON jobs_deps",
        "DELETE ON jobs_deps",
    ] {
        let others: Vec<&str> = WORKFLOW_PURGER
            .0
            .iter()
            .copied()
            .filter(|g| *g != missing)
            .collect();
        let (name, pool) = role_with(&db, &others).await;
        let err = sqlx::raw_sql(sqlx::AssertSqlSafe(delete.clone()))
            .execute(&pool)
            .await
            .expect_err(&format!("deleted a waited-for job without {missing}"))
            .to_string();
        assert!(
            err.contains("permission denied for table jobs_deps"),
            "{missing}: {err}"
        );
        drop_role(&db, pool, &name).await;
    }
    let (name, pool) = role_with(&db, WORKFLOW_PURGER.0).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(delete))
        .execute(&pool)
        .await
        .unwrap();
    drop_role(&db, pool, &name).await;
    assert_eq!(db.state(waits).await, "canceled");
    assert_eq!(db.state(below).await, "queued", "it ignores a cancel");

    each_grant_is_needed(&db, &WORKFLOW_PURGER, |pool| async move {
        Purger::new(&pool, &table(&pool).await?, PurgeOptions::new()).await?;
        Ok(())
    })
    .await;
}

// `Workflows` builds an enqueuer: on a keyed table with the progress side
// table, the keyed enqueuer's grants there too.
const KEYED_SIDE_WORKFLOW_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_deps",
    "INSERT ON jobs_deps",
    "UPDATE ON jobs_deps",
    "DELETE ON jobs_deps",
    "USAGE ON SEQUENCE jobs_workflow_seq",
    "SELECT ON jobs_progress",
    "DELETE ON jobs_progress",
]);

/// `Workflows` on a keyed table with the progress side table: with exactly
/// the documented grants it enqueues a workflow, and its enqueuer replaces a
/// keyed holder, dropping the old work's row; without any one grant
/// `Workflows::new` refuses to start, naming it.
#[tokio::test]
async fn workflows_on_a_keyed_progress_table_run_with_the_documented_grants() {
    let db = set_up().await;
    db.add_columns(
        |c| c.keys = true,
        &[dbworker::ddl::progress_table_sql("jobs").unwrap()],
    )
    .await;
    let table = |pool: PgPool| async move {
        let mut o = Db::table_options();
        o.workflows = true;
        o.key_column = Some("job_key".into());
        o.progress = true;
        JobTable::new(&pool, o).await
    };
    let (name, pool) = role_with(&db, KEYED_SIDE_WORKFLOW_ENQUEUER.0).await;
    let workflows = Workflows::new(&pool, &table(pool.clone()).await.unwrap())
        .await
        .unwrap();
    let run = workflows.enqueue(&two_steps()).await.unwrap();
    assert_eq!(db.state(run.id_of("second").unwrap()).await, "pending");
    let job = NewJob::new().key("k", KeyMode::Replace);
    let first = workflows.enqueuer().enqueue(&job).await.unwrap().id();
    db.execute(&format!(
        "INSERT INTO jobs_progress (job_id, checkpoint) VALUES ({first}, '{{}}')"
    ))
    .await;
    assert_eq!(
        workflows.enqueuer().enqueue(&job).await.unwrap(),
        Enqueued::Updated(first)
    );
    let left: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_progress WHERE job_id = $1",
            first,
        )
        .await;
    assert_eq!(left, 0, "the old work's row dropped");
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_SIDE_WORKFLOW_ENQUEUER, |pool| async move {
        Workflows::new(&pool, &table(pool.clone()).await?).await?;
        Ok(())
    })
    .await;
}
