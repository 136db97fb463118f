//! Retention on real Postgres: old finished rows go (deleted or archived) in
//! batches, per-state ages hold, live rows are never touched, and `dbworker
//! purge --once` does the same from the command line.

mod common;

use std::time::Duration;

use dbworker::maintenance::{PurgeOptions, Purger};
use workerutil::JobState;

use common::Db;

/// Rows in every state, finished `days` ago where finished.
async fn seed(db: &Db) {
    sqlx::raw_sql(
        "INSERT INTO jobs (state, finished_at) SELECT 'completed', now() - interval '10 days' FROM generate_series(1, 5);
         INSERT INTO jobs (state, finished_at) SELECT 'completed', now() - interval '1 day' FROM generate_series(1, 2);
         INSERT INTO jobs (state, finished_at) SELECT 'failed', now() - interval '40 days' FROM generate_series(1, 3);
         INSERT INTO jobs (state, finished_at) VALUES ('failed', now() - interval '10 days');
         INSERT INTO jobs (state, finished_at) VALUES ('canceled', now() - interval '40 days');
         INSERT INTO jobs (state) VALUES ('queued'), ('queued'), ('processing');
         INSERT INTO jobs (state, finished_at) VALUES ('errored', now() - interval '90 days');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn count(db: &Db, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn old_finished_rows_go_in_batches_and_live_rows_stay() {
    let db = Db::new().await;
    seed(&db).await;
    let mut o = PurgeOptions::new("jobs");
    o.batch_size = 2;
    let purger = Purger::new(db.pool.clone(), o).await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(
        purged.by_state,
        [
            (JobState::Completed, 5),
            (JobState::Failed, 3),
            (JobState::Canceled, 1)
        ]
    );
    // Recent finished rows and every live row (an errored job will run again)
    // are still there.
    for (state, left) in [
        ("completed", 2),
        ("failed", 1),
        ("canceled", 0),
        ("queued", 2),
        ("processing", 1),
        ("errored", 1),
    ] {
        assert_eq!(db.count(state).await, left, "{state}");
    }
    assert_eq!(purger.purge_once().await.unwrap().total(), 0);
}

#[tokio::test]
async fn rows_can_be_archived_instead_and_the_command_line_does_the_same() {
    let db = Db::new().await;
    seed(&db).await;
    let mut o = PurgeOptions::new("jobs");
    o.archive_table = Some("jobs_archive".into());
    let err = Purger::new(db.pool.clone(), o.clone()).await.unwrap_err();
    assert!(err.to_string().contains("jobs_archive"), "{err}");
    sqlx::raw_sql("CREATE TABLE jobs_archive (LIKE jobs)")
        .execute(&db.pool)
        .await
        .unwrap();
    o.max_age = vec![(JobState::Completed, Duration::ZERO)];
    let purger = Purger::new(db.pool.clone(), o).await.unwrap();
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
