//! Retention from the command line: `dbworker purge --once` does what the
//! library's purger does (dbworker/tests/operations/purge.rs).

use crate::common;
use crate::fixtures::purge as shared;

use std::time::Duration;

use dbworker::maintenance::{PurgeOptions, Purger};
use workerutil::JobState;

use common::Db;
use shared::seed;

async fn count(db: &Db, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn rows_can_be_archived_instead_and_the_command_line_does_the_same() {
    let db = Db::new().await;
    seed(&db).await;
    let table = db.table().await;
    let mut o = PurgeOptions::new();
    o.archive_table = Some("jobs_archive".into());
    let err = Purger::new(&db.pool, &table, o.clone()).await.unwrap_err();
    assert!(err.to_string().contains("jobs_archive"), "{err}");
    sqlx::raw_sql("CREATE TABLE jobs_archive (LIKE jobs)")
        .execute(&db.pool)
        .await
        .unwrap();
    o.max_age = vec![(JobState::Completed, Duration::ZERO)];
    let purger = Purger::new(&db.pool, &table, o).await.unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 7);
    assert_eq!(count(&db, "jobs_archive").await, 7);
    assert_eq!(db.count("completed").await, 0);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args([
            "purge",
            "--table",
            "jobs",
            "--failed-after-secs",
            "1728000",
            "--once",
        ])
        .env("DATABASE_URL", db.db.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only the state given: failed rows older than 20 days.
    assert_eq!(stdout.trim(), "purged 3 failed job(s)");
    assert_eq!(db.count("failed").await, 1);
    assert_eq!(db.count("canceled").await, 1);
}
