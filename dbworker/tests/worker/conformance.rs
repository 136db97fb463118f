//! The Postgres store passes the same conformance suite as the in-memory store,
//! in both handling modes, on the standard, the partitioned and the HOT
//! layout (through PgBouncer: pgbouncer_conformance.rs).

use crate::common;
use crate::fixtures::conformance as harness;

use dbworker::Handling;
use workerutil::conformance;

use common::Db;
use harness::Postgres;

#[tokio::test]
async fn postgres_store_passes_the_conformance_suite_with_transactional_handling() {
    let h = Postgres::new(Db::new().await, Handling::Transactional, false);
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn postgres_store_passes_the_conformance_suite_with_heartbeat_handling() {
    let h = Postgres::new(Db::new().await, Handling::Heartbeat, false);
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn partitioned_table_passes_the_conformance_suite_with_transactional_handling() {
    let h = Postgres::new(Db::partitioned().await, Handling::Transactional, true);
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn partitioned_table_passes_the_conformance_suite_with_heartbeat_handling() {
    let h = Postgres::new(Db::partitioned().await, Handling::Heartbeat, true);
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn hot_layout_passes_the_conformance_suite_with_transactional_handling() {
    let h = Postgres::new(Db::hot().await, Handling::Transactional, false);
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn hot_layout_passes_the_conformance_suite_with_heartbeat_handling() {
    let h = Postgres::new(Db::hot().await, Handling::Heartbeat, false);
    conformance::run_all(&h).await;
}
