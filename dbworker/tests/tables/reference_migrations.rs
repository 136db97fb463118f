//! The reference migrations in `migrations/` (what the examples run with
//! `sqlx::migrate!`) are the DDL generators' output for `example_jobs`, so
//! they never fall behind `dbworker migration`. After a generator changes:
//!
//! ```sh
//! UPDATE_SNAPSHOTS=1 cargo test -p dbworker --test tables reference_migrations
//! ```
//!
//! rewrites them; review the diff and commit it.

use std::collections::HashMap;
use std::path::PathBuf;

use dbworker::ddl::{
    OptionalColumns, history_table_sql, job_table_sql, notify_trigger_sql, optional_columns_sql,
};
use dbworker::history::DEFAULT_HISTORY_TABLE;

const TABLE: &str = "example_jobs";

/// The examples' own columns, added to the generated `CREATE TABLE`.
const APPLICATION_COLUMNS: &str = r#",
    -- Application columns: anything the handler needs.
    "payload" jsonb NOT NULL DEFAULT '{}',
    "cost" integer NOT NULL DEFAULT 0
);
"#;

/// Each reference migration's file name and text.
fn reference_migrations() -> Vec<(&'static str, String)> {
    let renames = HashMap::new();
    let table = job_table_sql(TABLE, &renames).unwrap();
    // The generated table ends its column list with the first "\n);\n".
    assert!(table.contains("\n);\n"), "{table}");
    let table = table.replacen("\n);\n", APPLICATION_COLUMNS, 1);
    let notify = notify_trigger_sql(TABLE, &renames, None).unwrap();
    let typed = optional_columns_sql(TABLE, &renames, OptionalColumns::typed()).unwrap();
    let mut retention = OptionalColumns::default();
    retention.retention = true;
    let retention = optional_columns_sql(TABLE, &renames, retention).unwrap();
    let history = history_table_sql(DEFAULT_HISTORY_TABLE).unwrap();
    vec![
        (
            "0001_example_jobs.sql",
            format!(
                "-- The reference job table used by the examples (usable with `sqlx::migrate!`).
-- Generate one for your own table with `cargo run -p dbworker-cli -- migration --table NAME`.
{table}"
            ),
        ),
        (
            "0002_example_jobs_notify.sql",
            format!(
                "-- LISTEN/NOTIFY wake-ups for {TABLE} (dbworker migration --table {TABLE} --notify).
-- Workers with StoreOptions::listen = Listen::TableChannel start new jobs at once.
{notify}"
            ),
        ),
        (
            "0003_example_jobs_typed.sql",
            format!(
                "-- The columns typed jobs need (dbworker migration --table {TABLE} --typed):
-- example_jobs has its payload column from 0001, so only `kind` is new here.
{typed}"
            ),
        ),
        (
            "0004_example_jobs_history.sql",
            format!(
                "-- The job history the dashboard's charts and `dbworker top` read, written by
-- dbworker::history::History (dbworker migration --table {TABLE} --history):
-- the index over finished_at it aggregates through, and the history table.
{retention}
{history}"
            ),
        ),
    ]
}

#[test]
fn the_reference_migrations_are_the_generators_output() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut stale = Vec::new();
    for (name, want) in reference_migrations() {
        let path = dir.join(name);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        if update {
            std::fs::write(&path, want).unwrap();
        } else {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "migrations/{stale:?} differ from the DDL generators' output; regenerate with \
         `UPDATE_SNAPSHOTS=1 cargo test -p dbworker --test tables reference_migrations` and review the diff"
    );
}
