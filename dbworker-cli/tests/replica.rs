//! The read commands with `--replica-url`: `status`, `list` and `show` read a
//! streaming replica (a job it has not replayed is not there) and `status`
//! says how far behind it is.

mod cli;
#[path = "../../dbworker/tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};
use std::time::Duration;

use cli::{ok, refused};
use common::Db;
use dbworker_testkit::{ThrowawayServer, find_pg_bin_dir};
use sqlx::PgPool;

fn dbworker(db: &Db, replica_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", db.db.url())
        .env("DBWORKER_REPLICA_URL", replica_url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

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
async fn status_list_and_show_read_the_replica() {
    if !find_pg_bin_dir().is_ok_and(|d| d.join("pg_basebackup").exists()) {
        eprintln!(
            "skipping: pg_basebackup is not installed next to the PostgreSQL server binaries"
        );
        return;
    }
    let primary = ThrowawayServer::start(&["fsync=off"]).expect("primary");
    let db = Db::on_server(primary.admin_url()).await;
    let replica_server = primary.start_replica().expect("replica");
    // The test database on the replica: its URL with the replica's port.
    let port = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    let replica_url = db.db.url().replacen(
        &format!(":{}/", port(primary.admin_url())),
        &format!(":{}/", port(replica_server.admin_url())),
        1,
    );
    assert_ne!(replica_url, db.db.url());
    let replica = PgPool::connect(&replica_url).await.unwrap();
    let first = db.enqueue(1, serde_json::json!({"note": "replayed"})).await[0];
    caught_up(&db.pool, &replica).await;

    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(&replica)
        .await
        .unwrap();
    let later = db.enqueue(1, serde_json::json!({"note": "not yet"})).await[0];

    let status = ok(&dbworker(&db, &replica_url, &["status"]));
    assert!(
        status.contains("read from a replica: last replayed commit"),
        "{status}"
    );
    let list = ok(&dbworker(&db, &replica_url, &["list"]));
    assert!(list.contains(&first.to_string()), "{list}");
    assert!(
        !list.lines().any(|l| l.starts_with(&later.to_string())),
        "{list}"
    );
    assert!(ok(&dbworker(&db, &replica_url, &["show", &first.to_string()])).contains("replayed"));
    refused(&dbworker(&db, &replica_url, &["show", &later.to_string()]));

    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&replica)
        .await
        .unwrap();
    caught_up(&db.pool, &replica).await;
    assert!(ok(&dbworker(&db, &replica_url, &["show", &later.to_string()])).contains("not yet"));
    replica.close().await;
    drop(replica_server);
}
