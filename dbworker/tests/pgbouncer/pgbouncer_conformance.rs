//! The store conformance suite through PgBouncer in transaction mode
//! (`Pooler::Transaction`), in both handling modes, on a plain and a
//! partitioned table: the store's pool connects to PgBouncer (eight server
//! connections), the suite sets up and inspects its jobs directly. Skipped,
//! saying why, without pgbouncer (.ci/run installs it).

use crate::common;
use crate::fixtures::conformance as harness;

use dbworker::{Handling, Pooler};
use dbworker_testkit::pgbouncer as bouncer;
use workerutil::conformance;

use crate::POOLER;
use bouncer::Bouncer;
use common::Db;
use harness::Postgres;

async fn through_pgbouncer(db: Db, handling: Handling, spread: bool, test: &str) {
    let Some(bouncer) = Bouncer::start_or_skip(test, db.db.url(), 8) else {
        return;
    };
    // The process-wide setting: the tests of this binary take turns.
    let _turn = POOLER.lock().await;
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let store_pool = bouncer.pool(16).await;
    let h = Postgres {
        db,
        handling,
        spread,
        store_pool,
    };
    conformance::run_all(&h).await;
    let log = bouncer.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}

#[tokio::test]
async fn the_conformance_suite_passes_through_pgbouncer_with_transactional_handling() {
    let db = Db::new().await;
    through_pgbouncer(db, Handling::Transactional, false, "transactional").await;
}

#[tokio::test]
async fn the_conformance_suite_passes_through_pgbouncer_with_heartbeat_handling() {
    let db = Db::new().await;
    through_pgbouncer(db, Handling::Heartbeat, false, "heartbeat").await;
}

#[tokio::test]
async fn a_partitioned_table_passes_the_conformance_suite_through_pgbouncer() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::partitioned().await;
        through_pgbouncer(db, handling, true, "partitioned").await;
    }
}
