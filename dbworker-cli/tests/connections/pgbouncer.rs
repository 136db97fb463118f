//! The operator commands through PgBouncer in transaction mode: refused with
//! the setting to use while the pooler goes unsaid, then, with
//! `DBWORKER_POOLER=transaction`, reading and acting as they do on a direct
//! connection, with no error in PgBouncer's log.

use crate::cli;
use crate::common;

use dbworker_testkit::pgbouncer as bouncer;
use std::process::{Command, Output};

use bouncer::Bouncer;
use cli::{ok, refused};
use common::Db;

fn dbworker(url: &str, pooler: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .env_remove("DBWORKER_POOLER");
    if let Some(pooler) = pooler {
        command.env("DBWORKER_POOLER", pooler);
    }
    command.output().unwrap()
}

#[tokio::test]
async fn operator_commands_work_through_pgbouncer_in_transaction_mode() {
    let db = Db::new().await;
    let Some(b) = Bouncer::start_or_skip("the CLI's PgBouncer test", db.db.url(), 2) else {
        return;
    };
    // Another sqlx program's statements are on both server connections.
    assert_eq!(b.leave_named_statements().await, 60);
    let failed: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobs (state, failure_message, num_failures, finished_at)
         SELECT 'failed', 'boom ' || i, 1, now() FROM generate_series(1, 3) i RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO jobs (state) SELECT 'queued' FROM generate_series(1, 5)")
        .execute(&db.pool)
        .await
        .unwrap();
    let url = b.url();

    // Unsaid, the start-up probe finds the pooler and names the setting.
    let err = refused(&dbworker(&url, None, &["status"]));
    assert!(
        err.contains("pooler in transaction mode") && err.contains("DBWORKER_POOLER=transaction"),
        "{err}"
    );

    let tx = Some("transaction");
    let status = ok(&dbworker(&url, tx, &["status", "--format", "json"]));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    // Live states are exact (finished ones are the planner's estimate here:
    // the test table has no retention index).
    assert_eq!(status["total"]["queued"], 5, "{status}");

    let list = ok(&dbworker(
        &url,
        tx,
        &["list", "--state", "failed", "--format", "json"],
    ));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let mut listed: Vec<i64> = list["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, failed);

    let shown = ok(&dbworker(&url, tx, &["show", &failed[0].to_string()]));
    assert!(shown.contains("boom 1"), "{shown}");

    ok(&dbworker(&url, tx, &["requeue", &failed[0].to_string()]));
    ok(&dbworker(&url, tx, &["delete", &failed[1].to_string()]));
    let states: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, state::text FROM jobs WHERE id = ANY($1) ORDER BY id")
            .bind(&failed)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        states,
        vec![(failed[0], "queued".into()), (failed[2], "failed".into())],
        "requeued, deleted, left alone"
    );

    let log = b.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}
