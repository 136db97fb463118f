//! The dashboard tests' jobs, shared by dbworker/tests/dashboard/dashboard.rs and
//! dbworker-cli/tests/commands/dashboard.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use dbworker::{
    control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE},
    ddl::{limit_table_sql, pause_table_sql},
};

use crate::common::Db;

/// Jobs in every state, hostile text in a payload and a failure message, a
/// secret in a payload; returns `(db, id of the hostile failed job)`.
pub async fn seed() -> (Db, i64) {
    seed_on(Db::new().await).await
}

/// [`seed`] on a table partitioned by day, the jobs spread over the last ten
/// days' partitions (the failed one five days back).
pub async fn seed_partitioned() -> (Db, i64) {
    let (db, failed) = seed_on(Db::partitioned().await).await;
    db.execute(
        "UPDATE jobs SET queued_at = now() - (id % 10) * interval '1 day' WHERE state <> 'failed';
         UPDATE jobs SET queued_at = now() - interval '5 days' WHERE state = 'failed';",
    )
    .await;
    assert_eq!(db.partitions_in_use().await, 10);
    (db, failed)
}

async fn seed_on(db: Db) -> (Db, i64) {
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
        ],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue, kind, payload) SELECT 'queued', 'mail', 'send', jsonb_build_object('customer_id', i::text) FROM generate_series(1, 30) AS i;
         INSERT INTO jobs (state, queue, kind, worker_hostname) VALUES ('processing', 'mail', 'send', 'host-7');
         INSERT INTO jobs (state, queue, kind, num_failures, failure_message, finished_at, payload)
           VALUES ('failed', 'reports', 'build', 3, '<script>alert(1)</script> & \"quotes\"', now(),
                   '{\"customer_id\": \"42\", \"note\": \"<img src=x onerror=alert(2)>\", \"api_key\": \"sk-live-123\"}');",
    )
    .await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'failed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    (db, id)
}
