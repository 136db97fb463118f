//! A job table with a history table and finished jobs spread over the last
//! three hours, shared by the history tests (dbworker/tests/operations/history.rs,
//! the dashboard's charts) and `dbworker top`'s (dbworker-cli, `#[path]`).

#![allow(dead_code, unreachable_pub)]

use dbworker::ddl::history_table_sql;
use dbworker::history::DEFAULT_HISTORY_TABLE;

use crate::common::Db;

/// `jobs` with a queue column, the retention index and the history table:
/// in `mail`, 600 completed jobs (a third retried once, a third twice)
/// finished between 3 minutes and 3 hours ago; in `reports`, 40 failed (3
/// attempts each) and 10 canceled before they started; in `timing`, 20
/// completed 90 minutes ago in one minute, run 1..=20 s, wait 2..=40 s.
pub async fn seed() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.retention = true;
        },
        &[history_table_sql(DEFAULT_HISTORY_TABLE).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue, num_failures, finished_at, started_at, queued_at)
           SELECT 'completed', 'mail', i % 3, f, f - (i % 20 + 1) * interval '1 second', f - (i % 20 + 1 + i % 7) * interval '1 second'
           FROM generate_series(1, 600) AS i,
                LATERAL (SELECT now() - interval '3 minutes' - (i * 17 % 10620) * interval '1 second' AS f) AS t;
         INSERT INTO jobs (state, queue, num_failures, finished_at, started_at, queued_at)
           SELECT 'failed', 'reports', 3, f, f - interval '2 seconds', f - interval '3 seconds'
           FROM generate_series(1, 40) AS i,
                LATERAL (SELECT now() - interval '5 minutes' - i * interval '4 minutes' AS f) AS t;
         INSERT INTO jobs (state, queue, finished_at)
           SELECT 'canceled', 'reports', now() - interval '4 minutes' - i * interval '7 minutes' FROM generate_series(1, 10) AS i;
         INSERT INTO jobs (state, queue, finished_at, started_at, queued_at)
           SELECT 'completed', 'timing', f, f - i * interval '1 second', f - i * interval '1 second' - 2 * i * interval '1 second'
           FROM generate_series(1, 20) AS i,
                LATERAL (SELECT to_timestamp(floor(EXTRACT(EPOCH FROM now() - interval '90 minutes') / 60) * 60 + 30) AS f) AS t;
         INSERT INTO jobs (state, queue) SELECT 'queued', 'mail' FROM generate_series(1, 5);
         ANALYZE jobs;",
    )
    .await;
    db
}

/// Finished jobs in `state` as the table counts them (per queue when given).
pub async fn finished(db: &Db, state: &str, queue: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE state = $1 AND ($2::text IS NULL OR queue = $2)",
    )
    .bind(state)
    .bind(queue)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// The history's sum of `column` for `jobs` (per queue when given).
pub async fn recorded(db: &Db, column: &str, queue: Option<&str>) -> i64 {
    let sql = format!(
        "SELECT COALESCE(sum(\"{column}\"), 0)::bigint FROM dbworker_history WHERE job_table = 'jobs' AND ($1::text IS NULL OR queue = $1)"
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(queue)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}
