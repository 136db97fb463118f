//! The cron tests' table: a kind column, a cron table, and the `JobTable`
//! with its kind and (jsonb) payload columns (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use dbworker::JobTable;
use dbworker::cron::DEFAULT_CRON_TABLE;
use dbworker::ddl::cron_table_sql;

use crate::common::Db;

pub async fn set_up() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| c.kind = true,
        &[cron_table_sql(DEFAULT_CRON_TABLE).unwrap()],
    )
    .await;
    db
}

/// The test table with its kind and (jsonb) payload columns.
pub async fn table(db: &Db) -> JobTable {
    db.table_with(|t| {
        t.kind_column = Some("kind".into());
        t.payload_column = Some("payload".into());
    })
    .await
}
