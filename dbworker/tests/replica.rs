//! Reading from a streaming replica: a `pg_basebackup -R` of a throwaway
//! cluster, started on another port. The dashboard's pages read from it
//! (a job the replica has not replayed yet is not there), say how far behind
//! it is, and an action still writes to the primary.

mod common;
#[path = "common/router.rs"]
mod router;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker_testkit::{ThrowawayServer, find_pg_bin_dir};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tower::ServiceExt;

use common::Db;
use router::get;

async fn post(app: &Router, path: &str, form: String) -> StatusCode {
    let r = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "localhost")
        .header(header::ORIGIN, "http://localhost")
        .header("sec-fetch-site", "same-origin")
        .body(Body::from(form))
        .unwrap();
    app.clone().oneshot(r).await.unwrap().status()
}

fn csrf(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
    page[start..][..page[start..].find('"').unwrap()].to_owned()
}

/// Waits until the replica has replayed everything the primary wrote so far.
async fn caught_up(primary: &PgPool, replica: &PgPool) {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(primary)
        .await
        .unwrap();
    for _ in 0..500 {
        let behind: bool = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() < $1::text::pg_lsn")
            .bind(&lsn)
            .fetch_one(replica)
            .await
            .unwrap();
        if !behind {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the replica never replayed up to {lsn}");
}

#[tokio::test]
async fn the_dashboard_reads_from_a_replica_and_acts_on_the_primary() {
    let has_basebackup = find_pg_bin_dir().is_ok_and(|d| d.join("pg_basebackup").exists());
    if !has_basebackup {
        eprintln!(
            "skipping: pg_basebackup is not installed next to the PostgreSQL server binaries"
        );
        return;
    }
    let primary = ThrowawayServer::start(&["fsync=off"]).expect("primary");
    let db = Db::on_server(primary.admin_url()).await;
    let replica_server = primary.start_replica().expect("replica");
    let options: PgConnectOptions = replica_server.admin_url().parse().unwrap();
    let replica = PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(options.database(db.db.name()));
    let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&replica)
        .await
        .unwrap();
    assert!(in_recovery, "the replica is a standby");

    db.execute(
        "INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'boom', now())",
    )
    .await;
    let failed: i64 = db.scalar("SELECT max(id) FROM jobs WHERE $1 = $1", 0).await;
    caught_up(&db.pool, &replica).await;

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
        .execute(&replica)
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
    let status = post(&app, &format!("/t/jobs/jobs/{failed}/action"), form).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(db.state(failed).await, "queued");
    // What the paused replica still shows is the old state, and its lag.
    let (_, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert!(page.contains("state-failed"), "{page}");

    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&replica)
        .await
        .unwrap();
    caught_up(&db.pool, &replica).await;
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{queued}")).await;
    assert_eq!(status, StatusCode::OK, "replayed now");
    assert!(page.contains("after the pause"), "{page}");
    let (_, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert!(page.contains("state-queued"), "{page}");

    replica.close().await;
    drop(replica_server);
}
