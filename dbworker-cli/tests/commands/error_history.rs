//! `dbworker show` prints a job's error history (`migration --error-history`)
//! through the binary, one entry per failed attempt; `migration --results`
//! prints the result columns.

use crate::cli;
use crate::common;

use dbworker::{DbStore, Handling};
use serde_json::{Value, json};
use workerutil::Store;

use cli::dbworker;
use common::{Db, Job};
use std::process::Command;

#[tokio::test]
async fn show_prints_each_failed_attempt() {
    let db = Db::new().await;
    // The column as the migration command prints it.
    let ddl = dbworker(&db, &["migration", "--error-history"]);
    assert!(ddl.status.success());
    let ddl = String::from_utf8(ddl.stdout).unwrap();
    let alter = ddl
        .lines()
        .find(|l| l.contains("ADD COLUMN IF NOT EXISTS \"errors\" jsonb"))
        .expect("the errors column");
    db.execute(alter).await;

    let id = db.enqueue(1, json!({})).await[0];
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.max_num_retries = 3;
    let table = db
        .table_with(|t| t.error_history_column = Some("errors".into()))
        .await;
    let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
    for (worker, message) in [("host-a", "first"), ("host-b", "second")] {
        let mut jobs = store.dequeue(worker, &Default::default(), 1).await.unwrap();
        assert!(
            store
                .mark_errored(&mut jobs[0], message, None)
                .await
                .unwrap()
                .is_some()
        );
        db.execute("UPDATE jobs SET process_after = NULL").await;
    }

    let out = dbworker(&db, &["show", &id.to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Value = serde_json::from_str(&stdout).unwrap();
    let errors = row["errors"].as_array().expect("the history");
    let entries: Vec<(i64, &str, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["attempt"].as_i64().unwrap(),
                e["worker"].as_str().unwrap(),
                e["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(entries, [(1, "host-a", "first"), (2, "host-b", "second")]);
    assert!(errors.iter().all(|e| e["at"].is_string()), "{errors:?}");
}

#[test]
fn migration_results_prints_the_result_columns() {
    let out = Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["migration", "--table", "jobs", "--workflows", "--results"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let ddl = String::from_utf8(out.stdout).unwrap();
    assert!(
        ddl.contains(r#"ADD COLUMN IF NOT EXISTS "result" jsonb"#)
            && ddl.contains(r#"ADD COLUMN IF NOT EXISTS "upstream_ids" bigint[]"#),
        "{ddl}"
    );
}
