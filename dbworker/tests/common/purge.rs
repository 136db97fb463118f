//! The purge tests' rows, shared by dbworker/tests/operations/purge.rs,
//! purge_history.rs, tables/partitioned.rs and
//! dbworker-cli/tests/services/purge.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use crate::common::Db;

/// Rows in every state, finished `days` ago where finished.
pub async fn seed(db: &Db) {
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

/// A completed job finished `ago` (SQL interval) ago; its id.
pub async fn completed(db: &Db, ago: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (state, finished_at, started_at, queued_at)
         VALUES ('completed', now() - $1::interval, now() - $1::interval, now() - $1::interval - interval '1 day')
         RETURNING id",
    )
    .bind(ago)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Whether job `id` is still in the table.
pub async fn exists(db: &Db, id: i64) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Creates `name`, an archive with the columns of `jobs` last first (same
/// names and types, another order than `LIKE` gives).
pub async fn reversed_archive(db: &Db, name: &str) {
    db.execute(&format!(
        "DO $$ DECLARE cols text; BEGIN
           SELECT string_agg(format('%I %s', attname, format_type(atttypid, atttypmod)), ', ' ORDER BY attnum DESC)
             INTO cols FROM pg_attribute WHERE attrelid = 'jobs'::regclass AND attnum > 0 AND NOT attisdropped;
           EXECUTE format('CREATE TABLE %I (%s)', '{name}', cols);
         END $$;"
    ))
    .await;
}

/// Every row of `table` as JSON (by column name, whatever their order),
/// by id.
pub async fn rows_as_json(db: &Db, table: &str) -> Vec<serde_json::Value> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT to_jsonb(r) FROM {table} r ORDER BY id"
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}
