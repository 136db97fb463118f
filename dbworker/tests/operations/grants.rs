//! Least privilege, as the operations manual's "Roles and grants" lists it:
//! for each role, a login role holding exactly the documented grants starts
//! its service and does its work; with any one of them revoked, the service
//! refuses to start, naming the grant, the table and the `GRANT` that gives it.

use crate::common;
use crate::fixtures::grants as roles;
use crate::fixtures::router;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use std::time::Duration;

use dbworker::KeyMode;
use dbworker::ResetterOptions;
use dbworker::admin::Admin;
use dbworker::cluster::{
    DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, LeaderElection, LeaderOptions, Node, NodeOptions,
    live_nodes,
};
use dbworker::control::{
    DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, Limit, Limits, Pauses, PausesOptions,
};
use dbworker::cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::history::{DEFAULT_HISTORY_TABLE, History, HistoryOptions};
use dbworker::maintenance::{PurgeOptions, Purger};
use dbworker::{DbStore, Enqueuer, Handling, JobTable, NewJob, Resetter};
use sqlx::PgPool;
use tower::ServiceExt;
use workerutil::JobState;

use common::{Db, Job};
use roles::{Grants, complete_jobs, drop_role, each_grant_is_needed, role_with};
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
        complete_jobs(&pool, &jobs, o, 1).await;
        assert_eq!(db.state(id).await, "completed", "{handling:?}");
        db.execute(&format!("UPDATE jobs SET state = 'queued' WHERE id = {id}"))
            .await;
    }
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &WORKER, |pool| async move {
        let jobs = table(&pool).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
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

// With keys, a keyed enqueue may replace the waiting holder in place.
const KEYED_PLAIN_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
]);

#[tokio::test]
async fn a_keyed_enqueuer_replaces_its_holder_with_update_too() {
    let db = Db::new().await;
    db.add_columns(|c| c.keys = true, &[]).await;
    let (name, pool) = role_with(&db, KEYED_PLAIN_ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(&pool, &keyed_table(&pool).await.unwrap())
        .await
        .unwrap();
    let job = NewJob::new().key("k", KeyMode::Replace);
    let first = enqueuer.enqueue(&job).await.unwrap().id();
    assert_eq!(enqueuer.enqueue(&job).await.unwrap().id(), first);
    assert_eq!(db.count("queued").await, 1);
    drop_role(&db, pool, &name).await;
    // A reader describes the keyed table with SELECT alone: the unique index
    // is checked by EXPLAIN of a keyed insert, which a reader may not run.
    let (name, pool) = role_with(&db, DASHBOARD.0).await;
    keyed_table(&pool).await.unwrap();
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_PLAIN_ENQUEUER, |pool| async move {
        Enqueuer::new(&pool, &keyed_table(&pool).await?).await?;
        Ok(())
    })
    .await;
}

// With keys and the progress side table, a replace deletes the old work's row.
const KEYED_SIDE_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_progress",
    "DELETE ON jobs_progress",
]);

#[tokio::test]
async fn a_keyed_enqueuer_on_a_table_with_a_progress_side_table_deletes_the_old_works_row() {
    let db = Db::new().await;
    db.add_columns(|c| c.keys = true, &[]).await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    let table = |pool: PgPool| async move {
        let mut o = Db::table_options();
        o.key_column = Some("job_key".into());
        o.progress = true;
        JobTable::new(&pool, o).await
    };
    let (name, pool) = role_with(&db, KEYED_SIDE_ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(&pool, &table(pool.clone()).await.unwrap())
        .await
        .unwrap();
    let job = NewJob::new().key("k", KeyMode::Replace);
    let first = enqueuer.enqueue(&job).await.unwrap().id();
    db.execute(&format!(
        "INSERT INTO jobs_progress (job_id, checkpoint) VALUES ({first}, '{{}}')"
    ))
    .await;
    assert_eq!(enqueuer.enqueue(&job).await.unwrap().id(), first);
    let left: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_progress WHERE job_id = $1",
            first,
        )
        .await;
    assert_eq!(left, 0);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_SIDE_ENQUEUER, |pool| async move {
        Enqueuer::new(&pool, &table(pool.clone()).await?).await?;
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
    .await
    .unwrap();
    resetter.check().await.unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().reset.len(), 1);
    assert_eq!(db.count("queued").await, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &RESETTER, |pool| async move {
        Resetter::new(&pool, &table(&pool).await?, ResetterOptions::default())
            .await?
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

// The control tables, as the manual's list under the table gives them.
const CONTROLLED_WORKER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON dbworker_pauses",
    // A claim under a rate limit spends the queue's tokens.
    "SELECT ON dbworker_limits",
    "UPDATE ON dbworker_limits",
]);
const PAUSER: Grants = Grants(&[
    "SELECT ON jobs",
    "SELECT ON dbworker_pauses",
    "INSERT ON dbworker_pauses",
    "DELETE ON dbworker_pauses",
]);
const LIMITER: Grants = Grants(&[
    "SELECT ON jobs",
    "SELECT ON dbworker_limits",
    "INSERT ON dbworker_limits",
    "UPDATE ON dbworker_limits",
    "DELETE ON dbworker_limits",
]);
const ARCHIVER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "DELETE ON jobs",
    "INSERT ON jobs_archive",
]);

/// The test table with a queue column, a pause table and a limit table.
async fn with_control_tables() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[
            dbworker::ddl::pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            dbworker::ddl::limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
        ],
    )
    .await;
    db
}

async fn controlled_table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    let mut o = Db::table_options();
    o.queue_column = Some("queue".into());
    o.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
    o.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    JobTable::new(pool, o).await
}

#[tokio::test]
async fn a_worker_honours_pauses_and_spends_rate_tokens_with_the_documented_grants() {
    let db = with_control_tables().await;
    db.execute("INSERT INTO jobs (queue) VALUES ('emails'), ('held')")
        .await;
    let emails: i64 = db
        .scalar("SELECT id FROM jobs WHERE queue = 'emails' AND $1 = $1", 0)
        .await;
    let held: i64 = db
        .scalar("SELECT id FROM jobs WHERE queue = 'held' AND $1 = $1", 0)
        .await;
    let owner = controlled_table(&db.pool).await.unwrap();
    Pauses::new(&db.pool, &owner, PausesOptions::default())
        .await
        .unwrap()
        .pause(Some("held"), "test")
        .await
        .unwrap();
    Limits::new(&db.pool, &owner)
        .await
        .unwrap()
        .set_limit("emails", Limit::default().rate(1.0, 5))
        .await
        .unwrap();
    // A full bucket: the claim need not wait for a refill.
    db.execute("UPDATE dbworker_limits SET tokens = 5").await;
    let tokens = "SELECT tokens FROM dbworker_limits WHERE queue = 'emails'";
    let before: f64 = sqlx::query_scalar(tokens)
        .fetch_one(&db.pool)
        .await
        .unwrap();

    let (name, pool) = role_with(&db, CONTROLLED_WORKER.0).await;
    let jobs = controlled_table(&pool).await.unwrap();
    complete_jobs(&pool, &jobs, db.options(), 1).await;
    assert_eq!(db.state(emails).await, "completed");
    assert_eq!(db.state(held).await, "queued", "a paused queue was claimed");
    let after: f64 = sqlx::query_scalar(tokens)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        after < before,
        "the claim spent no token: {before} -> {after}"
    );
    drop_role(&db, pool, &name).await;

    each_grant_is_needed(&db, &CONTROLLED_WORKER, |pool| async move {
        let jobs = controlled_table(&pool).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;
    // A table described without its control tables adopts them, so its
    // worker needs the same grants, each named when missing.
    each_grant_is_needed(&db, &CONTROLLED_WORKER, |pool| async move {
        let mut o = Db::table_options();
        o.queue_column = Some("queue".into());
        let jobs = JobTable::new(&pool, o).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_operator_pauses_and_sets_limits_with_the_documented_grants() {
    let db = with_control_tables().await;

    let (name, pool) = role_with(&db, PAUSER.0).await;
    let pauses = Pauses::new(
        &pool,
        &controlled_table(&pool).await.unwrap(),
        PausesOptions::default(),
    )
    .await
    .unwrap();
    pauses.check_writes().await.unwrap();
    assert!(pauses.pause(Some("emails"), "ops").await.unwrap());
    assert_eq!(pauses.list().await.unwrap().len(), 1);
    assert!(pauses.resume(Some("emails")).await.unwrap());
    assert!(pauses.list().await.unwrap().is_empty());
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PAUSER, |pool| async move {
        Pauses::new(
            &pool,
            &controlled_table(&pool).await?,
            PausesOptions::default(),
        )
        .await?
        .check_writes()
        .await
    })
    .await;

    let (name, pool) = role_with(&db, LIMITER.0).await;
    let limits = Limits::new(&pool, &controlled_table(&pool).await.unwrap())
        .await
        .unwrap();
    limits.check_writes().await.unwrap();
    limits.set("emails", 2).await.unwrap();
    limits.set("emails", 3).await.unwrap();
    assert_eq!(
        limits.list().await.unwrap(),
        [("emails".to_owned(), Limit::processing(3))]
    );
    assert!(limits.remove("emails").await.unwrap());
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &LIMITER, |pool| async move {
        Limits::new(&pool, &controlled_table(&pool).await?)
            .await?
            .check_writes()
            .await
    })
    .await;
}

#[tokio::test]
async fn a_purger_archives_with_insert_on_the_archive() {
    let db = Db::new().await;
    db.execute(
        "CREATE TABLE jobs_archive (LIKE jobs); INSERT INTO jobs (state, finished_at) VALUES ('completed', now() - interval '30 days'), ('completed', now())",
    )
    .await;
    let options = || {
        let mut o = PurgeOptions::new();
        o.archive_table = Some("jobs_archive".into());
        o
    };
    let (name, pool) = role_with(&db, ARCHIVER.0).await;
    let purger = Purger::new(&pool, &table(&pool).await.unwrap(), options())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 1);
    assert_eq!(db.count("completed").await, 1);
    let archived: i64 = db
        .scalar("SELECT count(*) FROM jobs_archive WHERE $1 = $1", 0)
        .await;
    assert_eq!(archived, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &ARCHIVER, |pool| async move {
        Purger::new(&pool, &table(&pool).await?, options()).await?;
        Ok(())
    })
    .await;
}

// A partitioned table's job keys live in its key table `jobs_keys`, which
// the table's triggers keep as the writing role.
const KEYED_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_keys",
    "INSERT ON jobs_keys",
    "UPDATE ON jobs_keys",
]);
const KEYED_WORKER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_keys",
    "DELETE ON jobs_keys",
]);
const KEYED_ADMIN: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "DELETE ON jobs",
    "SELECT ON jobs_keys",
    "INSERT ON jobs_keys",
    "DELETE ON jobs_keys",
]);
const KEYED_RESETTER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_keys",
    "DELETE ON jobs_keys",
]);

async fn keyed_table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    let mut o = Db::table_options();
    o.key_column = Some("job_key".into());
    JobTable::new(pool, o).await
}

async fn held_keys(db: &Db) -> i64 {
    db.scalar("SELECT count(*) FROM jobs_keys WHERE $1 = $1", 0)
        .await
}

#[tokio::test]
async fn a_partitioned_tables_key_table_gets_what_each_role_writes_through_it() {
    let db = Db::partitioned().await;
    let keys = dbworker::ddl::partitioned_keys_sql("jobs", &Default::default()).unwrap();
    db.execute(&keys).await;

    // The enqueuer inserts a keyed job, then replaces it in place.
    let (name, pool) = role_with(&db, KEYED_ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(&pool, &keyed_table(&pool).await.unwrap())
        .await
        .unwrap();
    let first = enqueuer
        .enqueue(&NewJob::new().key("k1", KeyMode::Replace))
        .await
        .unwrap();
    let again = enqueuer
        .enqueue(&NewJob::new().key("k1", KeyMode::Replace))
        .await
        .unwrap();
    assert_eq!(first.id(), again.id(), "the live holder was replaced");
    enqueuer
        .enqueue(&NewJob::new().key("k2", KeyMode::Replace))
        .await
        .unwrap();
    assert_eq!(held_keys(&db).await, 2);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_ENQUEUER, |pool| async move {
        Enqueuer::new(&pool, &keyed_table(&pool).await?).await?;
        Ok(())
    })
    .await;

    // The worker's completions free both keys.
    let (name, pool) = role_with(&db, KEYED_WORKER.0).await;
    let jobs = keyed_table(&pool).await.unwrap();
    complete_jobs(&pool, &jobs, db.options(), 2).await;
    assert_eq!(db.count("completed").await, 2);
    assert_eq!(held_keys(&db).await, 0);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_WORKER, |pool| async move {
        let jobs = keyed_table(&pool).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;

    // An operator cancels (frees the key), requeues (takes it again) and
    // deletes (frees it).
    let id = Enqueuer::new(&db.pool, &keyed_table(&db.pool).await.unwrap())
        .await
        .unwrap()
        .enqueue(&NewJob::new().key("k3", KeyMode::Replace))
        .await
        .unwrap()
        .id();
    let (name, pool) = role_with(&db, KEYED_ADMIN.0).await;
    let admin = Admin::new(&pool, &keyed_table(&pool).await.unwrap())
        .await
        .unwrap();
    admin.check_actions().await.unwrap();
    admin.check_deletes().await.unwrap();
    admin.cancel(id).await.unwrap();
    assert_eq!(held_keys(&db).await, 0);
    assert!(admin.requeue(id).await.unwrap());
    assert_eq!(held_keys(&db).await, 1);
    assert!(admin.delete(id).await.unwrap());
    assert_eq!(held_keys(&db).await, 0);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_ADMIN, |pool| async move {
        let admin = Admin::new(&pool, &keyed_table(&pool).await?).await?;
        admin.check_actions().await?;
        admin.check_deletes().await
    })
    .await;

    // A job reset past its limit fails and frees its key.
    db.execute(
        "INSERT INTO jobs (state, job_key, started_at, last_heartbeat_at, num_resets) VALUES ('processing', 'k4', now() - interval '1 hour', now() - interval '1 hour', 100)",
    )
    .await;
    assert_eq!(held_keys(&db).await, 1);
    let (name, pool) = role_with(&db, KEYED_RESETTER.0).await;
    let resetter = Resetter::new(
        &pool,
        &keyed_table(&pool).await.unwrap(),
        ResetterOptions::default(),
    )
    .await
    .unwrap();
    resetter.check().await.unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().failed.len(), 1);
    assert_eq!(held_keys(&db).await, 0);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_RESETTER, |pool| async move {
        Resetter::new(
            &pool,
            &keyed_table(&pool).await?,
            ResetterOptions::default(),
        )
        .await?
        .check()
        .await
    })
    .await;
}

// The cluster's tables, as the manual lists them.
const NODE: Grants = Grants(&[
    "SELECT ON dbworker_nodes",
    "INSERT ON dbworker_nodes",
    "UPDATE ON dbworker_nodes",
    "DELETE ON dbworker_nodes",
]);
const LEADER: Grants = Grants(&[
    "SELECT ON dbworker_leaders",
    "INSERT ON dbworker_leaders",
    "UPDATE ON dbworker_leaders",
]);
const REGISTRY_RESETTER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON dbworker_nodes",
    "DELETE ON dbworker_nodes",
]);

fn registry_resetter() -> ResetterOptions {
    let mut o = ResetterOptions::default();
    o.node_table = Some(DEFAULT_NODE_TABLE.into());
    o.dead_after = Duration::from_millis(300);
    o
}

#[tokio::test]
async fn a_process_registers_leads_and_is_rescued_with_the_cluster_grants() {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}",
        dbworker::ddl::node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        dbworker::ddl::leader_table_sql(DEFAULT_LEADER_TABLE).unwrap()
    ))
    .await;

    // A node registers, heartbeats and deregisters.
    let (name, pool) = role_with(&db, NODE.0).await;
    let node = Node::new(&pool, NodeOptions::default()).await.unwrap();
    node.heartbeat().await.unwrap();
    assert_eq!(
        live_nodes(&pool, DEFAULT_NODE_TABLE, Duration::from_secs(60))
            .await
            .unwrap()
            .len(),
        1
    );
    node.deregister().await.unwrap();
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &NODE, |pool| async move {
        Node::new(&pool, NodeOptions::default()).await?;
        Ok(())
    })
    .await;

    // A leader takes, fences and releases its lease.
    let (name, pool) = role_with(&db, LEADER.0).await;
    let election = LeaderElection::new(&pool, LeaderOptions::new("jobs", "n1"))
        .await
        .unwrap();
    assert!(election.try_lead().await.unwrap());
    assert_eq!(election.leader().await.unwrap().as_deref(), Some("n1"));
    election.release().await.unwrap();
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &LEADER, |pool| async move {
        LeaderElection::new(&pool, LeaderOptions::new("jobs", "n1")).await?;
        Ok(())
    })
    .await;

    // A resetter requeues a dead process's job at once and prunes its row.
    db.execute(
        "INSERT INTO dbworker_nodes (id, host, pid, version, queues, handlers, heartbeat_at) VALUES ('dead:1:x', 'dead', 1, '0', '{}', 1, now() - interval '1 hour');
         INSERT INTO jobs (state, worker_hostname, started_at, last_heartbeat_at) VALUES ('processing', 'dead:1:x', now() - interval '1 second', now() - interval '1 second')",
    )
    .await;
    let (name, pool) = role_with(&db, REGISTRY_RESETTER.0).await;
    let resetter = Resetter::new(&pool, &table(&pool).await.unwrap(), registry_resetter())
        .await
        .unwrap();
    resetter.check().await.unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().reset.len(), 1);
    assert_eq!(db.count("queued").await, 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &REGISTRY_RESETTER, |pool| async move {
        Resetter::new(&pool, &table(&pool).await?, registry_resetter())
            .await?
            .check()
            .await
    })
    .await;
}

const CRON: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON dbworker_cron",
    "INSERT ON dbworker_cron",
    "UPDATE ON dbworker_cron",
]);
const HISTORY: Grants = Grants(&[
    "SELECT ON jobs",
    "SELECT ON dbworker_history",
    "INSERT ON dbworker_history",
    "UPDATE ON dbworker_history",
    "DELETE ON dbworker_history",
]);

async fn scheduler(pool: &PgPool) -> Result<Scheduler, dbworker::Error> {
    Scheduler::new(pool, &table(pool).await?, SchedulerOptions::default())
        .await?
        .add(
            "every second",
            "* * * * * *",
            NewJob::new(),
            Backfill::RunOnce,
        )
}

#[tokio::test]
async fn a_cron_scheduler_and_the_history_run_with_their_documented_grants() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.retention = true,
        &[
            dbworker::ddl::cron_table_sql(DEFAULT_CRON_TABLE).unwrap(),
            dbworker::ddl::history_table_sql(DEFAULT_HISTORY_TABLE).unwrap(),
        ],
    )
    .await;

    // The first pass records the schedule, a later one enqueues its tick.
    let (name, pool) = role_with(&db, CRON.0).await;
    let cron = scheduler(&pool).await.unwrap();
    assert!(cron.tick().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!cron.tick().await.unwrap().is_empty());
    assert!(db.count("queued").await >= 1);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &CRON, |pool| async move {
        scheduler(&pool).await?;
        Ok(())
    })
    .await;

    // A pass counts the jobs finished minutes ago.
    db.execute(
        "INSERT INTO jobs (state, finished_at, started_at, queued_at)
           SELECT 'completed', now() - interval '5 minutes', now() - interval '6 minutes', now() - interval '7 minutes'
           FROM generate_series(1, 3);
         ANALYZE jobs",
    )
    .await;
    let (name, pool) = role_with(&db, HISTORY.0).await;
    let history = History::new(
        &pool,
        &table(&pool).await.unwrap(),
        HistoryOptions::default(),
    )
    .await
    .unwrap();
    assert!(history.record_once().await.unwrap().minutes >= 1);
    let completed: i64 = db
        .scalar(
            "SELECT sum(completed)::bigint FROM dbworker_history WHERE $1 = $1",
            0,
        )
        .await;
    assert_eq!(completed, 3);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &HISTORY, |pool| async move {
        History::new(&pool, &table(&pool).await?, HistoryOptions::default()).await?;
        Ok(())
    })
    .await;
}

// A fair table with signals, as the manual's rows for `jobs_fair_weights`
// and `jobs_signals` give them: every writer whose statement tags a job (an
// insert, a job that waits again) reads its key's weight; a worker reads
// the mailbox and marks a signal consumed; a sender inserts into it.
const FAIR_SIGNAL_WORKER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_fair_weights",
    "SELECT ON jobs_signals",
    "UPDATE ON jobs_signals",
]);
const FAIR_ENQUEUER: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON jobs_fair_weights",
]);
const SIGNAL_SENDER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_signals",
    "INSERT ON jobs_signals",
    "USAGE ON SEQUENCE jobs_signals_id_seq",
]);
const FAIR_OPERATOR: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_fair_weights",
]);
const FAIR_RESETTER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_fair_weights",
]);
// A dashboard with actions on such a table: the operator's, the weights'
// writes and the sender's (its job page sends signals).
const SIGNAL_DASHBOARD: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "DELETE ON jobs",
    "SELECT ON jobs_fair_weights",
    "INSERT ON jobs_fair_weights",
    "UPDATE ON jobs_fair_weights",
    "DELETE ON jobs_fair_weights",
    "SELECT ON jobs_signals",
    "INSERT ON jobs_signals",
    "USAGE ON SEQUENCE jobs_signals_id_seq",
]);
const WEIGHER: Grants = Grants(&[
    "SELECT ON jobs",
    "SELECT ON jobs_fair_weights",
    "INSERT ON jobs_fair_weights",
    "UPDATE ON jobs_fair_weights",
    "DELETE ON jobs_fair_weights",
]);

async fn fair_signal_table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    let mut o = Db::table_options();
    o.fair = true;
    o.signals = true;
    JobTable::new(pool, o).await
}

/// Waits for `paid`; resumed, consumes it and completes.
struct Pays;

impl workerutil::Handler<DbStore<Job>> for Pays {
    async fn handle(
        &self,
        job: &mut dbworker::DbJob<Job>,
        ctx: &workerutil::JobContext<DbStore<Job>>,
    ) -> Result<(), workerutil::HandlerError> {
        match job.signal::<serde_json::Value>(ctx.store(), "paid").await? {
            Some(_) => Ok(()),
            None => Err(workerutil::HandlerError::wait_for(
                "paid",
                Duration::from_secs(3600),
            )),
        }
    }
}

/// Polls `done` every 20 ms for up to 10 s.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_signalled_job_on_a_fair_table_runs_end_to_end_with_the_documented_grants() {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}INSERT INTO jobs_fair_weights VALUES ('acme', 4);",
        dbworker::ddl::fair_claims_sql("jobs", &Default::default(), &Default::default()).unwrap(),
        dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap(),
    ))
    .await;

    // The enqueuer's insert is tagged with its key's weight.
    let (enqueuer_role, enqueuer_pool) = role_with(&db, FAIR_ENQUEUER.0).await;
    let enqueuer = Enqueuer::new(
        &enqueuer_pool,
        &fair_signal_table(&enqueuer_pool).await.unwrap(),
    )
    .await
    .unwrap();
    let id = enqueuer
        .enqueue(&NewJob::new().fair_key("acme"))
        .await
        .unwrap()
        .id();
    drop_role(&db, enqueuer_pool, &enqueuer_role).await;

    // The worker's first attempt waits (a wait mark: the job is queued
    // again, so tagged again), the sender's signal wakes it, the second
    // attempt consumes the signal and completes.
    let (worker_role, worker_pool) = role_with(&db, FAIR_SIGNAL_WORKER.0).await;
    let jobs = fair_signal_table(&worker_pool).await.unwrap();
    let mut o = db.options();
    o.handling = Handling::Transactional;
    o.stall.stalled_max_age = Duration::from_secs(60);
    let store = std::sync::Arc::new(DbStore::new(&worker_pool, &jobs, o).await.unwrap());
    let mut w = workerutil::WorkerOptions::new("grants");
    w.interval = Duration::from_millis(20);
    w.num_total_jobs = Some(2);
    let worker = dbworker::new_worker(store.clone(), Pays, w).unwrap();
    let run = tokio::spawn(worker.run());
    until("the job never waited for its signal", async || {
        let awaiting: Option<String> = db
            .scalar("SELECT awaiting FROM jobs WHERE id = $1", id)
            .await;
        awaiting.as_deref() == Some("paid")
    })
    .await;

    let (sender_role, sender_pool) = role_with(&db, SIGNAL_SENDER.0).await;
    let sender_table = fair_signal_table(&sender_pool).await.unwrap();
    let admin = Admin::new(&sender_pool, &sender_table).await.unwrap();
    admin.check_signals().await.unwrap();
    let signals = dbworker::Signals::new(&sender_pool, &sender_table)
        .await
        .unwrap();
    assert!(
        signals
            .send(id, "paid", serde_json::json!({"amount": 5}), Some("evt_1"))
            .await
            .unwrap()
    );
    drop_role(&db, sender_pool, &sender_role).await;

    // Two attempts: the wait, then the completion (num_total_jobs).
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the signalled job did not complete")
        .unwrap();
    store.close().await;
    assert_eq!(db.state(id).await, "completed");
    let consumed: bool = db
        .scalar(
            "SELECT consumed_at IS NOT NULL FROM jobs_signals WHERE job_id = $1",
            id,
        )
        .await;
    assert!(consumed, "the resumed attempt did not consume the signal");
    drop_role(&db, worker_pool, &worker_role).await;

    // An operator's requeue and a resetter's reset tag the job again.
    db.execute(&format!(
        "UPDATE jobs SET state = 'failed' WHERE id = {id};
         INSERT INTO jobs (state, fair_key, started_at, last_heartbeat_at) VALUES ('processing', 'acme', now() - interval '1 hour', now() - interval '1 hour');"
    ))
    .await;
    let (name, pool) = role_with(&db, FAIR_OPERATOR.0).await;
    let admin = Admin::new(&pool, &fair_signal_table(&pool).await.unwrap())
        .await
        .unwrap();
    admin.check_actions().await.unwrap();
    assert!(admin.requeue(id).await.unwrap());
    drop_role(&db, pool, &name).await;
    let (name, pool) = role_with(&db, FAIR_RESETTER.0).await;
    let resetter = Resetter::new(
        &pool,
        &fair_signal_table(&pool).await.unwrap(),
        ResetterOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().reset.len(), 1);
    assert_eq!(db.count("queued").await, 2);
    drop_role(&db, pool, &name).await;

    // Weights set and removed as `dbworker fair` does.
    let (name, pool) = role_with(&db, WEIGHER.0).await;
    let weights =
        dbworker::control::FairWeights::new(&pool, &fair_signal_table(&pool).await.unwrap())
            .await
            .unwrap();
    weights.check_writes().await.unwrap();
    weights.set("globex", 2).await.unwrap();
    weights.set("globex", 3).await.unwrap();
    assert!(weights.remove("acme").await.unwrap());
    assert_eq!(weights.list().await.unwrap(), [("globex".to_owned(), 3)]);
    drop_role(&db, pool, &name).await;

    // Each of them refused at start-up without any one grant, naming it.
    each_grant_is_needed(&db, &FAIR_SIGNAL_WORKER, |pool| async move {
        let jobs = fair_signal_table(&pool).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;
    each_grant_is_needed(&db, &FAIR_ENQUEUER, |pool| async move {
        Enqueuer::new(&pool, &fair_signal_table(&pool).await?).await?;
        Ok(())
    })
    .await;
    each_grant_is_needed(&db, &SIGNAL_SENDER, |pool| async move {
        Admin::new(&pool, &fair_signal_table(&pool).await?)
            .await?
            .check_signals()
            .await
    })
    .await;
    each_grant_is_needed(&db, &FAIR_OPERATOR, |pool| async move {
        Admin::new(&pool, &fair_signal_table(&pool).await?)
            .await?
            .check_actions()
            .await
    })
    .await;
    each_grant_is_needed(&db, &FAIR_RESETTER, |pool| async move {
        Resetter::new(
            &pool,
            &fair_signal_table(&pool).await?,
            ResetterOptions::default(),
        )
        .await?
        .check()
        .await
    })
    .await;
    each_grant_is_needed(&db, &WEIGHER, |pool| async move {
        dbworker::control::FairWeights::new(&pool, &fair_signal_table(&pool).await?)
            .await?
            .check_writes()
            .await
    })
    .await;

    let (name, pool) = role_with(&db, SIGNAL_DASHBOARD.0).await;
    let o = DashboardOptions::new(vec![fair_signal_table(&pool).await.unwrap()]);
    Dashboard::new(&pool, o).await.unwrap();
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &SIGNAL_DASHBOARD, |pool| async move {
        let o = DashboardOptions::new(vec![fair_signal_table(&pool).await?]);
        Dashboard::new(&pool, o).await?;
        Ok(())
    })
    .await;
}

/// A worker on a table that keeps progress in its side table
/// (`migration --progress-table`): the table's grants and, on the side
/// table, what its writes use.
const PROGRESS_WORKER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_progress",
    "INSERT ON jobs_progress",
    "UPDATE ON jobs_progress",
]);
const PROGRESS_READER: Grants = Grants(&["SELECT ON jobs", "SELECT ON jobs_progress"]);
const PROGRESS_PURGER: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "DELETE ON jobs",
    "SELECT ON jobs_progress",
    "DELETE ON jobs_progress",
]);

async fn progress_table(pool: &PgPool) -> Result<JobTable, dbworker::Error> {
    let mut o = Db::table_options();
    o.progress = true;
    JobTable::new(pool, o).await
}

/// An operator's actions on a table with the progress side table: a
/// completion drops the job's checkpoint there.
const PROGRESS_OPERATOR: Grants = Grants(&[
    "SELECT ON jobs",
    "UPDATE ON jobs",
    "SELECT ON jobs_progress",
    "UPDATE ON jobs_progress",
]);

/// With exactly the documented grants an operator completes a job of a
/// table with the progress side table (its checkpoint dropped there);
/// without any one, `check_actions` names it.
#[tokio::test]
async fn an_operator_completes_jobs_of_a_progress_table_with_the_documented_grants() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    let id = db.enqueue(1, serde_json::json!({})).await[0];
    db.execute(&format!(
        "INSERT INTO jobs_progress (job_id, checkpoint) VALUES ({id}, '{{\"at\": 1}}')"
    ))
    .await;
    let (name, pool) = role_with(&db, PROGRESS_OPERATOR.0).await;
    let admin = Admin::new(&pool, &progress_table(&pool).await.unwrap())
        .await
        .unwrap();
    admin.check_actions().await.unwrap();
    let done = admin
        .act_on_ids(&[id], &dbworker::admin::BulkAction::Complete)
        .await
        .unwrap();
    assert_eq!(done, 1);
    let kept: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_progress WHERE job_id = $1 AND checkpoint IS NOT NULL",
            id,
        )
        .await;
    assert_eq!(kept, 0, "the completion dropped the checkpoint");
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PROGRESS_OPERATOR, |pool| async move {
        Admin::new(&pool, &progress_table(&pool).await?)
            .await?
            .check_actions()
            .await
    })
    .await;
}

/// With exactly the documented grants a worker saves a checkpoint, sets and
/// reports progress and completes, a reader shows the job with it and a
/// purger purges both rows; without any one, each refuses to start and
/// names it.
#[tokio::test]
async fn a_progress_table_is_written_read_and_purged_with_the_documented_grants() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    let id = db.enqueue(1, serde_json::json!({})).await[0];

    let (name, pool) = role_with(&db, PROGRESS_WORKER.0).await;
    let jobs = progress_table(&pool).await.unwrap();
    let store = DbStore::<Job>::new(&pool, &jobs, db.options())
        .await
        .unwrap();
    let mut job = workerutil::Store::dequeue(&store, "host", &Default::default(), 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(workerutil::Store::open(&store, &mut job).await.unwrap());
    job.save_checkpoint(&store, serde_json::json!({"next": 1}))
        .await
        .unwrap();
    job.set_progress(&store, serde_json::json!({"percent": 50}))
        .await
        .unwrap();
    job.report_progress(&store, serde_json::json!({"percent": 100}))
        .unwrap();
    assert!(
        workerutil::Store::mark_complete(&store, &mut job)
            .await
            .unwrap()
    );
    store.close().await;
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PROGRESS_WORKER, |pool| async move {
        let jobs = progress_table(&pool).await?;
        DbStore::<Job>::new(&pool, &jobs, Db::options_for_tests()).await?;
        Ok(())
    })
    .await;

    let (name, pool) = role_with(&db, PROGRESS_READER.0).await;
    let admin = Admin::new(&pool, &progress_table(&pool).await.unwrap())
        .await
        .unwrap();
    let row = admin.show(id).await.unwrap().unwrap();
    assert_eq!(row["progress"], serde_json::json!({"percent": 100}));
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PROGRESS_READER, |pool| async move {
        Admin::new(&pool, &progress_table(&pool).await?).await?;
        Ok(())
    })
    .await;

    db.execute("UPDATE jobs SET finished_at = now() - interval '30 days'")
        .await;
    let (name, pool) = role_with(&db, PROGRESS_PURGER.0).await;
    let purger = Purger::new(
        &pool,
        &progress_table(&pool).await.unwrap(),
        PurgeOptions::new(),
    )
    .await
    .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 1);
    let side: i64 = db
        .scalar("SELECT count(*) FROM jobs_progress WHERE job_id = $1", id)
        .await;
    assert_eq!(side, 0);
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &PROGRESS_PURGER, |pool| async move {
        Purger::new(&pool, &progress_table(&pool).await?, PurgeOptions::new()).await?;
        Ok(())
    })
    .await;
}

/// `Signals::new` checks the grants sending uses, as `Admin::check_signals`
/// does: without any one of them it refuses to start, naming it, instead of
/// failing the first send with a bare `permission denied`.
#[tokio::test]
async fn signals_are_refused_at_construction_without_the_senders_grants() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let signal_table = async |pool: &PgPool| {
        let mut o = Db::table_options();
        o.signals = true;
        JobTable::new(pool, o).await
    };
    let (name, pool) = role_with(&db, SIGNAL_SENDER.0).await;
    dbworker::Signals::new(&pool, &signal_table(&pool).await.unwrap())
        .await
        .unwrap();
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &SIGNAL_SENDER, |pool| async move {
        dbworker::Signals::new(&pool, &signal_table(&pool).await?).await?;
        Ok(())
    })
    .await;
}

/// `<table>_complete_jobs` (the SQL admin function) on a table with the
/// progress side table, called as a role with exactly the operator's
/// documented grants there: the completion drops the job's checkpoint in the
/// side table; without either grant on it the call fails naming the table.
#[tokio::test]
async fn the_sql_complete_function_drops_a_side_checkpoint_with_the_operators_grants() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    db.execute(
        &dbworker::ddl::admin_functions_sql("jobs", &Default::default(), Default::default())
            .unwrap(),
    )
    .await;
    let id = db.enqueue(1, serde_json::json!({})).await[0];
    db.execute(&format!(
        "INSERT INTO jobs_progress (job_id, checkpoint) VALUES ({id}, '{{\"at\": 1}}')"
    ))
    .await;
    let complete = format!("SELECT * FROM jobs_complete_jobs(ARRAY[{id}::bigint])");
    for missing in ["SELECT ON jobs_progress", "UPDATE ON jobs_progress"] {
        let others: Vec<&str> = PROGRESS_OPERATOR
            .0
            .iter()
            .copied()
            .filter(|g| *g != missing)
            .collect();
        let (name, pool) = role_with(&db, &others).await;
        let err = sqlx::raw_sql(sqlx::AssertSqlSafe(complete.clone()))
            .execute(&pool)
            .await
            .expect_err(&format!("completed without {missing}"))
            .to_string();
        assert!(
            err.contains("permission denied for table jobs_progress"),
            "{missing}: {err}"
        );
        drop_role(&db, pool, &name).await;
        assert_eq!(db.state(id).await, "queued", "rolled back");
    }
    let (name, pool) = role_with(&db, PROGRESS_OPERATOR.0).await;
    let outcomes: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(complete))
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(outcomes, [(id, "done".to_owned())]);
    drop_role(&db, pool, &name).await;
    assert_eq!(db.state(id).await, "completed");
    let kept: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_progress WHERE job_id = $1 AND checkpoint IS NOT NULL",
            id,
        )
        .await;
    assert_eq!(kept, 0, "the completion dropped the checkpoint");
}

/// A cron scheduler builds an enqueuer: on a keyed table with the progress
/// side table it needs the keyed enqueuer's grants there too (a tick that
/// replaces a waiting holder drops the old work's row). With exactly the
/// documented grants it replaces one; without any one it refuses to start.
const KEYED_SIDE_CRON: Grants = Grants(&[
    "SELECT ON jobs",
    "INSERT ON jobs",
    "UPDATE ON jobs",
    "USAGE ON SEQUENCE jobs_id_seq",
    "SELECT ON dbworker_cron",
    "INSERT ON dbworker_cron",
    "UPDATE ON dbworker_cron",
    "SELECT ON jobs_progress",
    "DELETE ON jobs_progress",
]);

#[tokio::test]
async fn a_cron_scheduler_on_a_keyed_progress_table_runs_with_the_documented_grants() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.keys = true,
        &[
            dbworker::ddl::cron_table_sql(DEFAULT_CRON_TABLE).unwrap(),
            dbworker::ddl::progress_table_sql("jobs").unwrap(),
        ],
    )
    .await;
    let scheduler = |pool: PgPool| async move {
        let mut o = Db::table_options();
        o.key_column = Some("job_key".into());
        o.progress = true;
        let table = JobTable::new(&pool, o).await?;
        Scheduler::new(&pool, &table, SchedulerOptions::default())
            .await?
            .add(
                "every second",
                "* * * * * *",
                NewJob::new().key("tick", KeyMode::Replace),
                Backfill::RunOnce,
            )
    };
    let (name, pool) = role_with(&db, KEYED_SIDE_CRON.0).await;
    let cron = scheduler(pool.clone()).await.unwrap();
    assert!(cron.tick().await.unwrap().is_empty());
    let holder: i64 = sqlx::query_scalar("INSERT INTO jobs (job_key) VALUES ('tick') RETURNING id")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    db.execute(&format!(
        "INSERT INTO jobs_progress (job_id, checkpoint) VALUES ({holder}, '{{}}')"
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        cron.tick().await.unwrap(),
        [("every second".to_owned(), holder)],
        "the holder replaced"
    );
    let left: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_progress WHERE job_id = $1",
            holder,
        )
        .await;
    assert_eq!(left, 0, "the old work's row dropped");
    drop_role(&db, pool, &name).await;
    each_grant_is_needed(&db, &KEYED_SIDE_CRON, |pool| async move {
        scheduler(pool).await?;
        Ok(())
    })
    .await;
}
