//! The read commands with `--replica-url`: `status`, `list` and `show` read a
//! streaming replica (a job it has not replayed is not there) and `status`
//! says how far behind it is.

use crate::cli;
use crate::common;
use crate::fixtures::replica as shared;

use std::process::{Command, Output};

use cli::{ok, refused};
use common::Db;
use shared::Replicated;

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

#[tokio::test]
async fn status_list_and_show_read_the_replica() {
    let Some(r) = Replicated::start_or_skip("the command line's replica test").await else {
        return;
    };
    let (db, replica, replica_url) = (&r.db, &r.replica, r.replica_url.as_str());
    let first = db.enqueue(1, serde_json::json!({"note": "replayed"})).await[0];
    r.caught_up().await;

    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(replica)
        .await
        .unwrap();
    let later = db.enqueue(1, serde_json::json!({"note": "not yet"})).await[0];

    let status = ok(&dbworker(db, replica_url, &["status"]));
    assert!(
        status.contains("read from a replica: last replayed commit"),
        "{status}"
    );
    let list = ok(&dbworker(db, replica_url, &["list"]));
    assert!(list.contains(&first.to_string()), "{list}");
    assert!(
        !list.lines().any(|l| l.starts_with(&later.to_string())),
        "{list}"
    );
    assert!(ok(&dbworker(db, replica_url, &["show", &first.to_string()])).contains("replayed"));
    refused(&dbworker(db, replica_url, &["show", &later.to_string()]));

    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(replica)
        .await
        .unwrap();
    r.caught_up().await;
    assert!(ok(&dbworker(db, replica_url, &["show", &later.to_string()])).contains("not yet"));
}

/// A writing command pointed at the replica (`DATABASE_URL` naming it)
/// refuses at start-up, naming the server as a read-only replica.
#[tokio::test]
async fn a_writing_command_pointed_at_a_replica_refuses_naming_it() {
    let Some(r) = Replicated::start_or_skip("the command line's replica-refusal test").await else {
        return;
    };
    let (db, replica_url) = (&r.db, r.replica_url.as_str());
    let id = db.enqueue(1, serde_json::json!({})).await[0];
    r.caught_up().await;
    for args in [
        vec!["requeue".to_owned(), id.to_string()],
        vec!["reset".to_owned(), "--once".to_owned()],
        vec!["cancel".to_owned(), id.to_string()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(&args)
            .args(["--table", "jobs"])
            .env("DATABASE_URL", replica_url)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = refused(&out);
        assert!(err.contains("read-only replica"), "{args:?}: {err}");
    }
}
