//! Retention from the command line: `dbworker purge --once` does what the
//! library's purger does (dbworker/tests/operations/purge.rs).

use crate::common;
use crate::fixtures::purge as shared;

use std::time::Duration;

use dbworker::ddl::history_table_sql;
use dbworker::history::DEFAULT_HISTORY_TABLE;
use dbworker::maintenance::{PurgeOptions, Purger};
use workerutil::JobState;

use common::Db;
use shared::{completed, exists, seed};

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

/// `dbworker purge --history` keeps a finished job until the job history
/// has recorded its minute, as `PurgeOptions::history` does
/// (dbworker/tests/operations/purge_history.rs): a job older than the
/// history's catch-up goes at its age. Before, the command had no such flag
/// and an age shorter than the history's settle purged jobs the charts never
/// counted.
#[tokio::test]
async fn purge_with_history_keeps_what_the_history_has_not_recorded() {
    let db = Db::new().await;
    let (fresh, hours_old) = (
        completed(&db, "10 seconds").await,
        completed(&db, "3 hours").await,
    );
    let purge = |extra: &[&str]| {
        let mut args = vec!["purge", "--completed-after", "1s", "--once"];
        args.extend_from_slice(extra);
        crate::cli::dbworker(&db, &args)
    };

    // No history table: refused, naming it and the migration that makes it.
    let err = crate::cli::refused(&purge(&["--history"]));
    assert!(
        err.contains("dbworker_history") && err.contains("dbworker migration --history"),
        "{err}"
    );
    assert!(exists(&db, fresh).await && exists(&db, hours_old).await);
    // The history's flags mean nothing without --history.
    let err = crate::cli::refused(&purge(&["--history-catch-up", "1h"]));
    assert!(err.contains("--history"), "{err}");
    assert!(exists(&db, fresh).await && exists(&db, hours_old).await);

    db.execute(&history_table_sql(DEFAULT_HISTORY_TABLE).unwrap())
        .await;
    // Nothing recorded, both within the history's 6 h catch-up: both kept.
    assert_eq!(
        crate::cli::ok(&purge(&["--history"])).trim(),
        "purged 0 completed job(s)"
    );
    assert!(exists(&db, fresh).await && exists(&db, hours_old).await);
    // A history catching up 1 h never records the 3-hour-old job: it goes.
    let out = crate::cli::ok(&purge(&["--history", "--history-catch-up", "1h"]));
    assert_eq!(out.trim(), "purged 1 completed job(s)");
    assert!(exists(&db, fresh).await && !exists(&db, hours_old).await);

    // Once the history's records reach past it, the fresh one goes too.
    db.execute(
        "INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed)
         VALUES ('jobs', '', date_trunc('minute', now()), 60, 1)",
    )
    .await;
    let out = crate::cli::ok(&purge(&[
        "--history",
        "--history-table",
        DEFAULT_HISTORY_TABLE,
    ]));
    assert_eq!(out.trim(), "purged 1 completed job(s)");
    assert!(!exists(&db, fresh).await);
}
