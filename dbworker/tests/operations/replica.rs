//! Reading from a streaming replica: a `pg_basebackup -R` of a throwaway
//! cluster, started on another port. The dashboard's pages read from it
//! (a job the replica has not replayed yet is not there), say how far behind
//! it is, and an action still writes to the primary.

use crate::common;
use crate::fixtures::replica as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};

use router::{csrf, get, post};
use shared::Replicated;

#[tokio::test]
async fn the_dashboard_reads_from_a_replica_and_acts_on_the_primary() {
    let Some(r) = Replicated::start_or_skip("the dashboard's replica test").await else {
        return;
    };
    let (db, replica) = (&r.db, &r.replica);

    db.execute(
        "INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'boom', now())",
    )
    .await;
    let failed: i64 = db.scalar("SELECT max(id) FROM jobs WHERE $1 = $1", 0).await;
    r.caught_up().await;

    let table = db.table().await;
    let mut o = DashboardOptions::new(vec![table]);
    o.replica = Some(replica.clone());
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("boom"), "{page}");
    assert!(page.contains("Read from a replica"), "{page}");
    assert!(page.contains("last replayed commit"), "{page}");
    let (status, overview) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    assert!(
        overview.contains("bytes of WAL still to replay"),
        "{overview}"
    );

    // The replica stops replaying: a job enqueued on the primary now is not
    // on its pages until it replays again, so the pages read the replica.
    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(replica)
        .await
        .unwrap();
    let queued = db
        .enqueue(1, serde_json::json!({"note": "after the pause"}))
        .await[0];
    let (status, _) = get(&app, &format!("/t/jobs/jobs/{queued}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not replayed yet");

    // An action meanwhile goes to the primary (the replica could not take
    // it: it is read-only, and paused besides).
    let form = format!("action=requeue&csrf={}", csrf(&page));
    let (status, _, _) = post(&app, &format!("/t/jobs/jobs/{failed}/action"), &form, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(db.state(failed).await, "queued");
    // What the paused replica still shows is the old state, and its lag.
    let (_, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert!(page.contains("state-failed"), "{page}");

    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(replica)
        .await
        .unwrap();
    r.caught_up().await;
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{queued}")).await;
    assert_eq!(status, StatusCode::OK, "replayed now");
    assert!(page.contains("after the pause"), "{page}");
    let (_, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert!(page.contains("state-queued"), "{page}");
}

/// A writing service given the replica's URL (a worker's store, an
/// enqueuer, a purger, the dashboard with actions, the resetter's check)
/// refuses to start, naming the server as a read-only replica, instead of
/// failing at every claim; a reader (the job table's check, the admin)
/// works there.
#[tokio::test]
async fn a_writer_given_a_replica_refuses_to_start_naming_it() {
    let Some(r) = Replicated::start_or_skip("the replica-refusal test").await else {
        return;
    };
    let (db, replica) = (&r.db, &r.replica);
    r.caught_up().await;
    let table = dbworker::JobTable::new(replica, common::Db::table_options())
        .await
        .expect("a reader works on a replica");
    dbworker::admin::Admin::new(replica, &table)
        .await
        .expect("so does the admin");
    let port = {
        let o: sqlx::postgres::PgConnectOptions = r.replica_url.parse().unwrap();
        o.get_port()
    };
    let Err(worker) = dbworker::DbStore::<common::Job>::new(replica, &table, db.options()).await
    else {
        panic!("a worker's store started on a replica");
    };
    let Err(enqueuer) = dbworker::Enqueuer::new(replica, &table).await else {
        panic!("an enqueuer started on a replica");
    };
    let Err(purger) = dbworker::maintenance::Purger::new(
        replica,
        &table,
        dbworker::maintenance::PurgeOptions::default(),
    )
    .await
    else {
        panic!("a purger started on a replica");
    };
    let Err(dashboard) = Dashboard::new(replica, DashboardOptions::new(vec![table.clone()])).await
    else {
        panic!("a dashboard with actions started on a replica");
    };
    // Refused where it is built: `new` checks the grants.
    let Err(resetter) =
        dbworker::Resetter::new(replica, &table, dbworker::ResetterOptions::new("r")).await
    else {
        panic!("a resetter started on a replica");
    };
    for err in [
        worker.to_string(),
        enqueuer.to_string(),
        purger.to_string(),
        dashboard.to_string(),
        resetter.to_string(),
    ] {
        assert!(
            err.contains("read-only replica") && err.contains(&format!(":{port}")),
            "{err}"
        );
    }
}
