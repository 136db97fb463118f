//! Log consumers and the command line: `dbworker status --events-table`
//! prints each consumer's checkpoint, lag and process (the rest of the
//! consumer tests: dbworker/tests/consumers/consumers.rs).

use crate::fixtures::consumers as shared;

use std::sync::atomic::Ordering;

use dbworker::consumers::{DEFAULT_CHECKPOINT_TABLE, consumer_lag};

use shared::{Project, append, assignments, fast_group, projected, set_up, start, wait_for};

#[tokio::test]
async fn every_event_is_handled_once_per_consumer_with_its_writes() {
    let db = set_up().await;
    append(&db, 250).await;
    let (a, b, c) = (
        Project::new("audit"),
        Project::new("billing"),
        Project::new("crm"),
    );
    let p = start(
        &db,
        [a.clone(), b.clone(), c.clone()].into_iter().collect(),
        fast_group(),
    )
    .await;
    wait_for("the first 250", async || projected(&db, "crm").await == 250).await;
    // More events while running: a notification wakes the consumers.
    append(&db, 50).await;
    for name in ["audit", "billing", "crm"] {
        wait_for(name, async || projected(&db, name).await == 300).await;
    }
    let lag = consumer_lag(
        &db.pool,
        "events",
        "global_position",
        DEFAULT_CHECKPOINT_TABLE,
    )
    .await
    .unwrap();
    assert_eq!(lag.len(), 3);
    assert!(
        lag.iter().all(|l| l.lag() == 0 && l.latest == 300),
        "{lag:?}"
    );
    // Exactly once: the primary key would have refused a second row, and no
    // handler was called more often than there are events.
    for consumer in [&a, &b, &c] {
        assert_eq!(consumer.calls.load(Ordering::SeqCst), 300);
    }
    let owners = assignments(&db).await;
    assert!(owners.iter().all(|(_, n)| n == p.node.id()), "{owners:?}");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["status", "--table", "jobs", "--events-table", "events"])
        .env("DATABASE_URL", db.db.url())
        .output()
        .unwrap();
    let status = String::from_utf8(status.stdout).unwrap();
    let crm: Vec<&str> = status
        .lines()
        .find(|l| l.starts_with("crm "))
        .unwrap_or_else(|| panic!("{status}"))
        .split_whitespace()
        .collect();
    assert_eq!(crm, ["crm", "300", "300", "0", p.node.id()], "{status}");
    p.stop().await.unwrap();
}
