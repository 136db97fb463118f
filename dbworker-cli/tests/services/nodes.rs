//! Resetter processes on real Postgres: `dbworker reset --lead` processes
//! elect a leader, fail over after SIGKILL and hand over after SIGTERM, and
//! `dbworker status` shows them (the library's side: dbworker/tests/cluster/nodes.rs).

use crate::common;
use crate::fixtures::nodes as shared;

use std::time::{Duration, Instant};

use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, current_leader};

use common::Db;
use shared::set_up;

fn dbworker(db: &Db, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"));
    c.args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", db.db.url())
        .env("RUST_LOG", "warn");
    c
}

async fn leader_now(db: &Db) -> Option<String> {
    current_leader(&db.pool, DEFAULT_LEADER_TABLE, "jobs")
        .await
        .unwrap()
}

#[tokio::test]
async fn resetter_processes_elect_a_leader_and_status_shows_them() {
    let db = set_up().await;
    let ddl = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["migration", "--table", "x", "--nodes"])
        .output()
        .unwrap();
    let ddl = String::from_utf8(ddl.stdout).unwrap();
    assert!(
        ddl.contains("CREATE TABLE IF NOT EXISTS \"dbworker_nodes\""),
        "{ddl}"
    );
    assert!(
        ddl.contains("CREATE TABLE IF NOT EXISTS \"dbworker_leaders\""),
        "{ddl}"
    );

    let reset = [
        "reset",
        "--lead",
        "--node-table",
        DEFAULT_NODE_TABLE,
        "--lease-secs",
        "0.6",
        "--interval-secs",
        "0.2",
    ];
    let mut children: Vec<std::process::Child> = (0..2)
        .map(|_| dbworker(&db, &reset).spawn().unwrap())
        .collect();
    let start = Instant::now();
    let first = loop {
        if let Some(l) = leader_now(&db).await {
            break l;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = dbworker(&db, &["status", "--node-table", DEFAULT_NODE_TABLE])
        .output()
        .unwrap();
    let status = String::from_utf8(status.stdout).unwrap();
    assert!(status.contains("live processes: 2"), "{status}");
    // A resetter claims nothing, so it honours no pause or limit table.
    assert!(
        status.contains("honours: no pause or limit table"),
        "{status}"
    );
    assert!(status.contains(&format!("{first} (leader)")), "{status}");

    // SIGKILL the leader: the other process leads within the lease and a third.
    let pid: u32 = first.split(':').nth(1).unwrap().parse().unwrap();
    let leader = children
        .iter()
        .position(|c| c.id() == pid)
        .expect("the leader is a child");
    let mut killed = children.remove(leader);
    killed.kill().unwrap();
    killed.wait().unwrap();
    let killed_at = Instant::now();
    let second = loop {
        if let Some(l) = leader_now(&db).await
            && l != first
        {
            break l;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(5), "no failover");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = killed_at.elapsed();
    println!("resetter failover after SIGKILL: {took:?} (lease 600ms)");
    assert!(took <= Duration::from_millis(1200), "took {took:?}");
    assert!(second.contains(&format!(":{}:", children[0].id())));

    // SIGTERM: the survivor deregisters and releases its lease.
    let pid = children[0].id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(children[0].wait().unwrap().success());
    assert_eq!(leader_now(&db).await, None);
    let rows: Vec<String> = sqlx::query_scalar("SELECT id FROM dbworker_nodes")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        [first],
        "only the killed process's row is left, to age out"
    );
}
