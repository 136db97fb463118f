//! The registry tests' database, shared by dbworker/tests/cluster/nodes.rs and
//! dbworker-cli/tests/services/nodes.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use dbworker::{
    cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE},
    ddl::{leader_table_sql, node_table_sql},
};

use crate::common::Db;

/// A database with the worker registry and the leader lease table.
pub async fn set_up() -> Db {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}",
        node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap()
    ))
    .await;
    db
}
