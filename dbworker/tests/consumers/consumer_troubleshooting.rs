//! The log consumers' troubleshooting SQL of dbworker/docs/operations.md, read from the
//! file by its `sql-check` markers and run against a real database with a
//! healthy consumer, a stuck one and a leader: each query answers what its
//! section says it does, so the docs cannot drift from the tables.

use crate::CLUSTER;
use crate::common;
use crate::fixtures::consumers as shared;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dbworker::consumers::Consumers;
use sqlx::Row;
use sqlx::postgres::PgRow;

use shared::{Project, append, fast_group, projected, set_up, start, wait_for};

const OPERATIONS: &str = include_str!("../../docs/operations.md");

/// The SQL block after `<!-- sql-check: name -->`.
fn checked_sql(name: &str) -> String {
    let marker = format!("<!-- sql-check: {name} -->");
    let at = OPERATIONS
        .find(&marker)
        .unwrap_or_else(|| panic!("dbworker/docs/operations.md has no {marker}"));
    let rest = &OPERATIONS[at + marker.len()..];
    let body = rest
        .trim_start()
        .strip_prefix("```sql\n")
        .unwrap_or_else(|| panic!("{marker} is not followed by a sql block"));
    body[..body.find("```").expect("the block ends")].to_owned()
}

async fn run(db: &common::Db, name: &str) -> Vec<PgRow> {
    let sql = checked_sql(name);
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .fetch_all(&db.pool)
        .await
        .unwrap_or_else(|err| panic!("{name} failed: {err}\n{sql}"))
}

/// The block's rows through `SELECT <select> FROM (<block>) q`.
async fn run_as(db: &common::Db, name: &str, select: &str) -> Vec<PgRow> {
    let sql = checked_sql(name);
    let sql = format!(
        "SELECT {select} FROM ({}) q",
        sql.trim().trim_end_matches(';')
    );
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .fetch_all(&db.pool)
        .await
        .unwrap_or_else(|err| panic!("{name} failed: {err}\n{sql}"))
}

#[test]
fn every_marker_is_checked_here() {
    let names: Vec<&str> = OPERATIONS
        .split("<!-- sql-check: ")
        .skip(1)
        .map(|s| &s[..s.find(" -->").unwrap()])
        .collect();
    assert_eq!(
        names,
        [
            "consumer-assignments",
            "consumer-lag",
            "consumer-held-back",
            "consumer-not-advancing",
            "consumer-stuck-event",
            "consumer-leader",
        ]
    );
}

#[tokio::test]
async fn the_consumer_troubleshooting_queries_find_the_stuck_consumer_its_event_and_the_leader() {
    // Alone: "consumer-held-back" names the cluster's oldest open transaction.
    let _alone = CLUSTER.write().await;
    let db = set_up().await;
    let healthy = Project::new("audit");
    let broken = Arc::new(Project {
        name: "order_totals".into(),
        calls: AtomicUsize::new(0),
        fail: true,
        slow: Duration::ZERO,
    });
    let mut o = fast_group();
    o.log.max_consecutive_failures = 1_000_000;
    let p = start(
        &db,
        Consumers::new().add(healthy.clone()).add(broken.clone()),
        o,
    )
    .await;
    // A rolled-back append leaves a gap before the first event.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO events (aggregate_type, aggregate_id, event_type) VALUES ('order', 'gone', 'x')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    append(&db, 10).await;
    wait_for("audit", async || projected(&db, "audit").await == 10).await;
    wait_for("order_totals failing", async || {
        broken.calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    // As if it had been stuck for five minutes (the query asks for one). It
    // has no checkpoint row: its first slice never committed.
    db.execute(
        "UPDATE dbworker_consumer_assignments SET updated_at = now() - interval '5 minutes' \
         WHERE consumer_name = 'order_totals'",
    )
    .await;

    let assignments = run(&db, "consumer-assignments").await;
    assert_eq!(assignments.len(), 2);
    let node: String = assignments[0].get("node_id");

    let lag = run(&db, "consumer-lag").await;
    let lags: Vec<(String, i64)> = lag
        .iter()
        .map(|r| (r.get("consumer_name"), r.get("lag")))
        .collect();
    assert_eq!(lags, [("order_totals".into(), 11), ("audit".into(), 0)]);

    let stalled = run(&db, "consumer-not-advancing").await;
    assert_eq!(stalled.len(), 1, "only the stuck consumer");
    assert_eq!(stalled[0].get::<String, _>("consumer_name"), "order_totals");
    assert_eq!(stalled[0].get::<String, _>("node_id"), node);
    assert_eq!(stalled[0].get::<i64, _>("last_position"), 0);
    assert!(!stalled[0].get::<bool, _>("holder_dead"));

    let stuck = run(&db, "consumer-stuck-event").await;
    assert_eq!(stuck.len(), 1);
    assert_eq!(
        stuck[0].get::<i64, _>("global_position"),
        2,
        "the first event after the checkpoint, past the gap at 1"
    );
    assert_eq!(stuck[0].get::<String, _>("aggregate_id"), "o1");

    let leader = run(&db, "consumer-leader").await;
    assert_eq!(leader.len(), 1);
    assert_eq!(leader[0].get::<String, _>("scope"), "consumers:projections");
    assert_eq!(leader[0].get::<String, _>("node_id"), node);
    let since = "leading_since::text AS since, pid";
    let first: String = run_as(&db, "consumer-leader", since).await[0].get("since");
    // The lease is renewed every 200 ms; `acquired_at` stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = run_as(&db, "consumer-leader", since).await;
    assert_eq!(again[0].get::<String, _>("since"), first);
    assert!(
        again[0].get::<Option<i32>, _>("pid").is_some(),
        "joined with the registry"
    );

    // A transaction that wrote and stays open holds every consumer back; the
    // query names it, and ending it releases the waiting event.
    let mut open = db.pool.begin().await.unwrap();
    let (holder, _xid): (i32, String) =
        sqlx::query_as("SELECT pg_backend_pid(), pg_current_xact_id()::text")
            .fetch_one(&mut *open)
            .await
            .unwrap();
    // Appended without waiting for it to be final: it cannot be while the
    // transaction above is open.
    sqlx::query("INSERT INTO events (aggregate_type, aggregate_id, event_type) VALUES ('order', 'late', 'placed')")
        .execute(&db.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        projected(&db, "audit").await,
        10,
        "held behind the open transaction"
    );
    let held = run(&db, "consumer-held-back").await;
    assert_eq!(held[0].get::<i32, _>("pid"), holder);
    open.commit().await.unwrap();
    wait_for("the waiting event", async || {
        projected(&db, "audit").await == 11
    })
    .await;
    p.stop().await.ok();
}
