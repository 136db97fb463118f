//! Names another program or operator chose — a paused queue and who paused
//! it, a limited queue, a fair key, a signal's name, a process's id,
//! version, queues and what it honours, the leader, a consumer and its
//! process — reach the terminal with their control characters as spaces:
//! an escape sequence cannot clear or retitle it, a new line cannot forge a
//! line of output (`list`, `status` and `workflow show`'s job names:
//! operator_output.rs).

use std::collections::HashMap;
use std::process::Output;

use crate::cli;
use crate::common;

use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE};
use dbworker::consumers::{DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE};
use dbworker::ddl::{
    FairClaims, consumer_tables_sql, events_table_sql, fair_claims_sql, leader_table_sql,
    limit_table_sql, node_table_sql, pause_table_sql, signals_sql,
};

use cli::dbworker;
use common::Db;

/// A name that clears the screen, then forges a line of its own.
const NAME: &str = "n\x1b[2J\nFORGED";
/// How it prints: control characters as spaces.
const SHOWN: &str = "n [2J FORGED";

/// Both streams of `out`, which must show nothing raw.
fn raw_free(out: &Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains('\x1b') && !text.lines().any(|l| l.starts_with("FORGED")),
        "{what} printed a raw name: {text:?}"
    );
    text
}

/// [`raw_free`], and showing the name as `SHOWN`.
fn escaped(out: &Output, what: &str) -> String {
    let text = raw_free(out, what);
    assert!(text.contains(SHOWN), "{what}: {text:?}");
    text
}

#[tokio::test]
async fn every_command_prints_names_from_elsewhere_with_control_characters_as_spaces() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.keys = true;
        },
        &[
            pause_table_sql(dbworker::control::DEFAULT_PAUSE_TABLE).unwrap(),
            limit_table_sql(dbworker::control::DEFAULT_LIMIT_TABLE).unwrap(),
            signals_sql("jobs", &Default::default()).unwrap(),
            fair_claims_sql("jobs", &HashMap::new(), &FairClaims::default()).unwrap(),
            node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
            leader_table_sql(DEFAULT_LEADER_TABLE).unwrap(),
            consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE).unwrap(),
            events_table_sql("events", "events_appended").unwrap(),
        ],
    )
    .await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (queue, fair_key, worker_hostname) VALUES ($1, $1, $1) RETURNING id",
    )
    .bind(NAME)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // A process, a leader not in the registry, a consumer and its process,
    // each named by whoever ran them.
    for sql in [
        "INSERT INTO dbworker_nodes (id, host, pid, version, queues, honours) VALUES ($1, 'h', 1, $1, ARRAY[$1], ARRAY[$1])",
        "INSERT INTO dbworker_leaders (scope, node_id, expires_at) VALUES ('jobs', $1 || 'L', now() + interval '1 hour')",
        "INSERT INTO dbworker_consumer_checkpoints (consumer_name) VALUES ($1)",
        "INSERT INTO dbworker_consumer_assignments (consumer_name, node_id) VALUES ($1, $1)",
    ] {
        sqlx::query(sql).bind(NAME).execute(&db.pool).await.unwrap();
    }

    let id = id.to_string();
    for args in [
        &["pause", "--queue", NAME, "--by", NAME][..],
        &[
            "status",
            "--node-table",
            DEFAULT_NODE_TABLE,
            "--events-table",
            "events",
        ],
        &["limit", "set", "--queue", NAME, "--max-processing", "1"],
        &["limit", "list"],
        &["limit", "clear", "--queue", NAME],
        &["fair"],
        &["signal", "--id", &id, "--name", NAME],
        &["resume", "--queue", NAME],
    ] {
        let out = dbworker(&db, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        escaped(&out, &format!("{args:?}"));
    }
    // `top` cuts the queue column to its width: nothing raw is enough.
    let top = dbworker(&db, &["top", "--once"]);
    assert!(top.status.success(), "{top:?}");
    raw_free(&top, "top --once");
    let status = escaped(
        &dbworker(
            &db,
            &[
                "status",
                "--node-table",
                DEFAULT_NODE_TABLE,
                "--events-table",
                "events",
            ],
        ),
        "status",
    );
    for line in [
        &format!("  {SHOWN}  pid 1  v{SHOWN}"),
        &format!("queues [{SHOWN}]"),
        &format!("honours: {SHOWN}"),
        &format!("leader: {SHOWN}L (not in the registry)"),
    ] {
        assert!(status.contains(line.as_str()), "{line:?} in {status}");
    }
    // JSON (`show`, `--format json`) escapes them as JSON: serde_json left
    // DEL and the C1 set raw, U+009B a terminal's CSI among them.
    let csi: i64 =
        sqlx::query_scalar("INSERT INTO jobs (queue) VALUES (E'c\\u009b2J\\u007f') RETURNING id")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let csi = csi.to_string();
    for args in [
        &["show", &csi][..],
        &["show", &csi, "--format", "json"],
        &["list", "--format", "json"],
        &["status", "--format", "json"],
        &["list"],
    ] {
        let out = cli::ok(&dbworker(&db, args));
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?}: {out:?}"
        );
    }
    let shown = cli::ok(&dbworker(&db, &["show", &csi]));
    assert!(shown.contains(r#""c\u009b2J\u007f""#), "{shown}");

    // An error quoting the database's text about a name: escaped too.
    let out = dbworker(&db, &["signal", "--key", NAME, "--name", "paid"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    escaped(&out, "signal to an unknown key");
}
