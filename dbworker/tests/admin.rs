//! The `dbworker` operator commands end to end against real Postgres: status,
//! show, requeue, cancel, fail, delete, pause and resume — each acting only on
//! the states it names, never on a job a worker holds.

mod common;

use std::process::{Command, Output};

use dbworker::{DEFAULT_PAUSE_TABLE, pause_table_sql};

use common::Db;

fn dbworker(db: &Db, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", db.db.url())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One job per state; returns their ids by state.
async fn seed(db: &Db) -> std::collections::HashMap<&'static str, i64> {
    db.add_columns(
        |c| c.queue = true,
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    let mut ids = std::collections::HashMap::new();
    for state in ["queued", "errored", "processing", "failed", "completed"] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobs (state, queue, worker_hostname, num_failures) VALUES ($1, 'mail', CASE WHEN $1 = 'processing' THEN 'host-1' ELSE '' END, 2) RETURNING id",
        )
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ids.insert(state, id);
    }
    ids
}

#[tokio::test]
async fn each_command_acts_only_on_the_states_it_names() {
    let db = Db::new().await;
    let ids = seed(&db).await;
    let id = |s: &str| ids[s].to_string();

    let status = ok(&dbworker(&db, &["status", "--queue-column", "queue"]));
    assert!(
        status.contains("queued       mail                      1"),
        "{status}"
    );
    assert!(status.contains("processing on host-1: 1"), "{status}");

    let shown = ok(&dbworker(&db, &["show", &id("failed")]));
    assert!(shown.contains("\"state\": \"failed\""), "{shown}");

    // Requeue: a failed job runs again with a fresh failure count; a queued
    // one is not "requeued".
    ok(&dbworker(&db, &["requeue", &id("failed")]));
    assert_eq!(db.state(ids["failed"]).await, "queued");
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", ids["failed"])
        .await;
    assert_eq!(failures, 0);
    assert!(refused(&dbworker(&db, &["requeue", &id("queued")])).contains("not failed"));

    // Cancel: a waiting job at once; a processing one through its worker.
    ok(&dbworker(&db, &["cancel", &id("queued")]));
    assert_eq!(db.state(ids["queued"]).await, "canceled");
    let asked = ok(&dbworker(&db, &["cancel", &id("processing")]));
    assert!(asked.contains("next heartbeat"), "{asked}");
    assert_eq!(db.state(ids["processing"]).await, "processing");
    let flag: bool = db
        .scalar("SELECT cancel FROM jobs WHERE id = $1", ids["processing"])
        .await;
    assert!(flag);

    ok(&dbworker(
        &db,
        &["fail", &id("errored"), "--message", "bad payload"],
    ));
    assert_eq!(db.state(ids["errored"]).await, "failed");
    let message: String = db
        .scalar(
            "SELECT failure_message FROM jobs WHERE id = $1",
            ids["errored"],
        )
        .await;
    assert_eq!(message, "bad payload");

    // A job a worker holds is never deleted.
    refused(&dbworker(&db, &["delete", &id("processing")]));
    ok(&dbworker(&db, &["delete", &id("completed")]));
    let left: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", ids["completed"])
        .await;
    assert_eq!(left, 0);

    let paused = ok(&dbworker(
        &db,
        &["pause", "--queue", "mail", "--by", "test"],
    ));
    assert_eq!(paused.trim(), "paused queue mail");
    let by: String =
        sqlx::query_scalar("SELECT paused_by FROM dbworker_pauses WHERE queue = 'mail'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(by, "test");
    assert_eq!(
        ok(&dbworker(&db, &["resume", "--queue", "mail"])).trim(),
        "resumed queue mail"
    );
    assert!(ok(&dbworker(&db, &["resume", "--queue", "mail"])).contains("already"));
}
