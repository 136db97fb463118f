//! The purge tests' rows, shared by dbworker/tests/operations/purge.rs and
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
