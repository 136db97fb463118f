//! Least privilege, as the operations manual's "Roles and grants" lists it:
//! for each role, a login role holding exactly the documented grants starts
//! its service and does its work; with any one of them revoked, the service
//! refuses to start, naming the grant, the table and the `GRANT` that gives it.

mod common;
#[path = "common/grants.rs"]
mod roles;
#[path = "common/router.rs"]
mod router;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dbworker::admin::Admin;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::maintenance::{PurgeOptions, Purger, ResetterOptions};
use dbworker::{DbStore, Enqueuer, Handling, JobTable, NewJob, Resetter, new_worker};
use sqlx::PgPool;
use tower::ServiceExt;
use workerutil::{JobState, WorkerOptions};

use common::{Completes, Db};
use roles::{Grants, drop_role, each_grant_is_needed, role_with};
use router::get;

const WORKER: Grants = Grants(&["SELECT ON jobs", "UPDATE ON jobs"]);
const ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
]);
const ADMIN: Grants = Grants(&["SELECT ON jobs", "UPDATE ON jobs", "DELETE ON jobs"]);
const DASHBOARD: Grants = Grants(&["SELECT ON jobs"]);
const RESETTER: Grants = Grants(&["SELECT ON jobs", "UPDATE ON jobs"]);
// A purge locks each batch (FOR UPDATE SKIP LOCKED): a row lock needs UPDATE.
const PURGER: Grants = Grants(&["SELECT ON jobs", "UPDATE ON jobs", "DELETE ON jobs"]);

async fn table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    JobTable::new(pool, Db::table_options()).await
}

#[tokio::test]
async fn a_worker_claims_and_completes_with_select_and_update_only() {
    let db = Db::new().await;
    let id = db.enqueue(1, serde_json::json!({})).await[0];
    let (name, pool) = role_with(&db, WORKER.0).await;
    let jobs = table(&pool).await.unwrap();
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        let mut o = db.options();
        o.handling = handling;
        let store = std::sync::Arc::new(DbStore::new(&pool, &jobs, o).await.unwrap());
        let mut w = WorkerOptions::new("grants");
        w.interval = Duration::from_millis(20);
        w.heartbeat_interval = Duration::from_millis(100);
        w.heartbeat_failure_limit = Some(Duration::from_secs(2));
        w.num_total_jobs = Some(1);
        new_worker(store.clone(), Completes, w).unwrap().run().await;
        store.close().await;
        assert_eq!(db.state(id).await, "completed", "{handling:?}");
        db.execute(&format!("UPDATE jobs SET state = 'queued' WHERE id = {id}"))
            .await;
    }
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &WORKER, |pool| async move {
        let jobs = table(&pool).await?;
        DbStore::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_enqueuer_inserts_with_insert_and_the_sequence() {
    let db = Db::new().await;
    let (name, pool) = role_with(&db, ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(&pool, &table(&pool).await.unwrap())
        .await
        .unwrap();
    let id = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    assert_eq!(db.state(id).await, "queued");
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &ENQUEUER, |pool| async move {
        Enqueuer::new(&pool, &table(&pool).await?).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_operator_acts_and_deletes_with_update_and_delete() {
    let db = Db::new().await;
    let ids = db.enqueue(2, serde_json::json!({})).await;
    let (name, pool) = role_with(&db, ADMIN.0).await;
    let admin = Admin::new(&pool, &table(&pool).await.unwrap())
        .await
        .unwrap();
    admin.check_actions().await.unwrap();
    admin.check_deletes().await.unwrap();
    admin.cancel(ids[0]).await.unwrap();
    assert_eq!(db.state(ids[0]).await, "canceled");
    assert!(admin.requeue(ids[0]).await.unwrap());
    assert_eq!(db.state(ids[0]).await, "queued");
    assert!(admin.delete(ids[1]).await.unwrap());
    assert_eq!(db.count("queued").await, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &ADMIN, |pool| async move {
        let admin = Admin::new(&pool, &table(&pool).await?).await?;
        admin.check_actions().await?;
        admin.check_deletes().await
    })
    .await;
}

#[tokio::test]
async fn a_resetter_resets_with_update() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, started_at, last_heartbeat_at) VALUES ('processing', now() - interval '1 hour', now() - interval '1 hour')",
    )
    .await;
    let (name, pool) = role_with(&db, RESETTER.0).await;
    let resetter = Resetter::new(
        &pool,
        &table(&pool).await.unwrap(),
        ResetterOptions::default(),
    )
    .unwrap();
    resetter.check().await.unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().reset.len(), 1);
    assert_eq!(db.count("queued").await, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &RESETTER, |pool| async move {
        Resetter::new(&pool, &table(&pool).await?, ResetterOptions::default())?
            .check()
            .await
    })
    .await;
}

#[tokio::test]
async fn a_purger_deletes_with_update_and_delete() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, finished_at) VALUES ('completed', now() - interval '30 days'), ('completed', now())",
    )
    .await;
    let (name, pool) = role_with(&db, PURGER.0).await;
    let purger = Purger::new(&pool, &table(&pool).await.unwrap(), PurgeOptions::new())
        .await
        .unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.by_state[0], (JobState::Completed, 1));
    assert_eq!(purged.total(), 1);
    assert_eq!(db.count("completed").await, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PURGER, |pool| async move {
        Purger::new(&pool, &table(&pool).await?, PurgeOptions::new()).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_read_only_dashboard_serves_with_select_and_offers_no_action() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'boom', now())",
    )
    .await;
    let id: i64 = db.scalar("SELECT max(id) FROM jobs WHERE $1 = $1", 0).await;
    let (name, pool) = role_with(&db, DASHBOARD.0).await;
    let jobs = table(&pool).await.unwrap();

    // Actions asked for (the default): refused at start-up, naming the
    // grant and the way out.
    let err = Dashboard::new(&pool, DashboardOptions::new(vec![jobs.clone()]))
        .await
        .expect_err("actions need UPDATE")
        .to_string();
    assert!(
        err.contains(&format!(
            "role {name} lacks UPDATE on table jobs, which acting on jobs needs: GRANT UPDATE ON jobs TO {name}"
        )) && err.contains("DashboardOptions::read_only"),
        "{err}"
    );

    let mut o = DashboardOptions::new(vec![jobs]);
    o.read_only = true;
    let app = Dashboard::new(&pool, o).await.unwrap().router();
    let (status, overview) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    assert!(overview.contains("read-only"), "{overview}");
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("boom"), "{page}");
    // Everyone is read-only (Auth::None makes everyone an admin otherwise):
    // no action form, and a posted one is refused.
    assert!(!page.contains("/action\""), "{page}");
    let res = app
        .clone()
        .oneshot(
            Request::post(format!("/t/jobs/jobs/{id}/action"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from("action=requeue"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(db.state(id).await, "failed");
    drop_role(&db, pool, &name).await;

    each_grant_is_needed(&db, &DASHBOARD, |pool| async move {
        let mut o = DashboardOptions::new(vec![table(&pool).await?]);
        o.read_only = true;
        Dashboard::new(&pool, o).await?;
        Ok(())
    })
    .await;
}
