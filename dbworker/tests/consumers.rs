//! Checkpointed log consumers on real Postgres: every event handled once per
//! consumer with its writes, assignments rebalanced when processes join and
//! die, a process that lost a consumer unable to advance its checkpoint, and a
//! consumer that keeps failing stopping its group.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    Error,
    cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, Node, NodeOptions},
    consumers::{
        Consumer, ConsumerGroup, ConsumerGroupOptions, DEFAULT_ASSIGNMENT_TABLE,
        DEFAULT_CHECKPOINT_TABLE, LogOptions, LogStore, consumer_lag,
    },
    ddl::{consumer_tables_sql, events_table_sql, leader_table_sql, node_table_sql},
};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use workerutil::{BoxError, Job, Store};

use common::Db;

#[derive(Debug, sqlx::FromRow)]
struct Event {
    global_position: i64,
    aggregate_id: String,
}

/// Records each event it sees in `projection`, in the batch's transaction.
struct Project {
    name: String,
    calls: AtomicUsize,
    fail: bool,
    /// Takes this long per event.
    slow: Duration,
}

impl Project {
    fn new(name: &str) -> Arc<Project> {
        Arc::new(Project {
            name: name.into(),
            calls: AtomicUsize::new(0),
            fail: false,
            slow: Duration::ZERO,
        })
    }
}

#[async_trait::async_trait]
impl Consumer<Event> for Project {
    fn name(&self) -> &str {
        &self.name
    }

    async fn handle(&self, tx: &mut PgConnection, event: &Event) -> Result<(), BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        sqlx::query(
            "INSERT INTO projection (consumer, position, aggregate_id) VALUES ($1, $2, $3)",
        )
        .bind(&self.name)
        .bind(event.global_position)
        .bind(&event.aggregate_id)
        .execute(&mut *tx)
        .await?;
        tokio::time::sleep(self.slow).await;
        if self.fail {
            return Err("the projection is broken".into());
        }
        Ok(())
    }
}

async fn set_up() -> Db {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}{}{}
         CREATE TABLE projection (consumer text, position bigint, aggregate_id text, PRIMARY KEY (consumer, position));",
        node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap(),
        consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE).unwrap(),
        events_table_sql("events", "events_appended").unwrap(),
    ))
    .await;
    db
}

async fn append(db: &Db, n: i64) {
    sqlx::query(
        "INSERT INTO events (aggregate_type, aggregate_id, event_type) \
         SELECT 'order', 'o' || i, 'placed' FROM generate_series(1, $1) AS i",
    )
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

fn fast_node() -> NodeOptions {
    let mut o = NodeOptions::default();
    o.heartbeat_interval = Duration::from_millis(50);
    o.dead_after = Duration::from_millis(400);
    o
}

fn fast_group() -> ConsumerGroupOptions {
    let mut o = ConsumerGroupOptions::new("projections", "events e");
    o.dead_after = Duration::from_millis(400);
    o.lease = Duration::from_millis(600);
    o.rebalance_interval = Duration::from_millis(100);
    o.poll_interval = Duration::from_millis(50);
    o.log.batch_size = 40;
    o.log.batch_pause = Duration::from_millis(5);
    o.log.retry_after = Duration::from_millis(20);
    o.log.listen = Some("events_appended".into());
    o
}

/// A process: a node, its heartbeats and its part of the group.
struct Process {
    node: Node,
    stop: CancellationToken,
    beat: tokio::task::JoinHandle<()>,
    run: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Process {
    /// Dies without a word, as with SIGKILL: no deregistration, no release.
    fn kill(self) {
        self.beat.abort();
        self.run.abort();
    }

    /// Waits for the group to stop by itself (a consumer kept failing).
    async fn until_it_stops(self) -> Result<(), Error> {
        let result = tokio::time::timeout(Duration::from_secs(20), self.run)
            .await
            .expect("the group stops by itself")
            .unwrap();
        self.stop.cancel();
        self.beat.await.unwrap();
        result
    }

    async fn stop(self) -> Result<(), Error> {
        self.stop.cancel();
        let result = self.run.await.unwrap();
        self.beat.await.unwrap();
        result
    }
}

async fn start(
    db: &Db,
    consumers: Vec<Arc<dyn Consumer<Event>>>,
    group: ConsumerGroupOptions,
) -> Process {
    let pool = db.db.pool(8).await.unwrap();
    let node = Node::register(&pool, fast_node()).await.unwrap();
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let group = ConsumerGroup::new(&pool, &node, group, consumers)
        .await
        .unwrap();
    let run = tokio::spawn(group.run(stop.clone()));
    Process {
        node,
        stop,
        beat,
        run,
    }
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn projected(db: &Db, consumer: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM projection WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn assignments(db: &Db) -> Vec<(String, String)> {
    sqlx::query_as("SELECT consumer_name, node_id FROM dbworker_consumer_assignments ORDER BY 1")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn every_event_is_handled_once_per_consumer_with_its_writes() {
    let db = set_up().await;
    append(&db, 250).await;
    let (a, b, c) = (
        Project::new("audit"),
        Project::new("billing"),
        Project::new("crm"),
    );
    let p = start(&db, vec![a.clone(), b.clone(), c.clone()], fast_group()).await;
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

#[tokio::test]
async fn consumers_are_rebalanced_when_processes_join_and_die() {
    let db = set_up().await;
    let names = ["a", "b", "c", "d"];
    let consumers = || -> Vec<Arc<dyn Consumer<Event>>> {
        names
            .iter()
            .map(|n| Project::new(n) as Arc<dyn Consumer<Event>>)
            .collect()
    };
    let first = start(&db, consumers(), fast_group()).await;
    wait_for("all four on the first process", async || {
        let a = assignments(&db).await;
        a.len() == 4 && a.iter().all(|(_, n)| n == first.node.id())
    })
    .await;

    let joined_at = Instant::now();
    let second = start(&db, consumers(), fast_group()).await;
    let mut ids = [first.node.id().to_owned(), second.node.id().to_owned()];
    ids.sort();
    // Sorted names round-robin over sorted node ids.
    let expected: Vec<(String, String)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ((*n).to_owned(), ids[i % 2].clone()))
        .collect();
    wait_for("two each", async || assignments(&db).await == expected).await;
    println!("rebalanced after a join in {:?}", joined_at.elapsed());

    // Events appended now are all handled, each consumer by its own process.
    append(&db, 120).await;
    for name in names {
        wait_for(name, async || projected(&db, name).await == 120).await;
    }

    // The second dies without a word: its consumers come back to the first.
    second.kill();
    let died_at = Instant::now();
    wait_for("all four back", async || {
        assignments(&db)
            .await
            .iter()
            .all(|(_, n)| n == first.node.id())
    })
    .await;
    println!(
        "rebalanced after a death in {:?} (dead after 400ms)",
        died_at.elapsed()
    );
    append(&db, 30).await;
    for name in names {
        wait_for(name, async || projected(&db, name).await == 150).await;
    }
    first.stop().await.unwrap();
}

#[tokio::test]
async fn a_process_that_lost_its_consumer_cannot_advance_the_checkpoint() {
    let db = set_up().await;
    append(&db, 10).await;
    let mut o = LogOptions::new("log", "events e", "node-a", vec!["audit".into()]);
    o.batch_size = 5;
    o.batch_pause = Duration::ZERO;
    let store = LogStore::<Event>::new(db.db.pool(4).await.unwrap(), o)
        .await
        .unwrap();
    db.execute("INSERT INTO dbworker_consumer_assignments (consumer_name, node_id) VALUES ('audit', 'node-a')")
        .await;
    let checkpoint = async || -> Option<i64> {
        sqlx::query_scalar(
            "SELECT last_position FROM dbworker_consumer_checkpoints WHERE consumer_name = 'audit'",
        )
        .fetch_optional(&db.pool)
        .await
        .unwrap()
    };

    // Claimed, then reassigned before it opened: it never runs.
    let mut jobs = store.dequeue("node-a", &(), 1).await.unwrap();
    assert_eq!(jobs.len(), 1);
    db.execute("UPDATE dbworker_consumer_assignments SET node_id = 'node-b'")
        .await;
    assert!(!store.open(&mut jobs[0]).await.unwrap());
    drop(jobs);
    assert_eq!(checkpoint().await.unwrap_or(0), 0);
    assert!(
        store.dequeue("node-a", &(), 1).await.unwrap().is_empty(),
        "not assigned here"
    );

    // Opened while assigned: the batch holds the assignment row, so a
    // reassignment waits for the batch and cannot steal it (and the leader's
    // rebalance skips the row until the batch ends).
    db.execute("UPDATE dbworker_consumer_assignments SET node_id = 'node-a'")
        .await;
    let mut job = store
        .dequeue("node-a", &(), 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(store.open(&mut job).await.unwrap());
    assert_eq!(job.record().events.len(), 5);
    let blocked = sqlx::raw_sql(
        "SET statement_timeout = '300ms'; UPDATE dbworker_consumer_assignments SET node_id = 'node-b'",
    )
    .execute(&db.pool)
    .await;
    assert!(blocked.is_err(), "the reassignment waits for the batch");
    assert!(store.mark_complete(&mut job).await.unwrap());
    assert_eq!(checkpoint().await, Some(5));

    // A late write from a batch whose checkpoint moved on is fenced off.
    let mut stale = store
        .dequeue("node-a", &(), 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(store.open(&mut stale).await.unwrap());
    db.execute("SET lock_timeout = '1s'").await;
    store.requeue(&mut stale).await.unwrap();
    db.execute("UPDATE dbworker_consumer_checkpoints SET last_position = 7")
        .await;
    let mut moved = stale;
    assert!(
        !store.open(&mut moved).await.unwrap(),
        "the checkpoint is not the one it claimed"
    );
    assert_eq!(checkpoint().await, Some(7));
}

#[tokio::test]
async fn a_consumer_that_keeps_failing_stops_its_group_and_writes_nothing() {
    let db = set_up().await;
    append(&db, 20).await;
    let broken = Arc::new(Project {
        name: "broken".into(),
        calls: AtomicUsize::new(0),
        fail: true,
        slow: Duration::ZERO,
    });
    let mut o = fast_group();
    o.log.max_consecutive_failures = 3;
    let result = start(&db, vec![broken.clone()], o)
        .await
        .until_it_stops()
        .await;
    match result {
        Err(Error::ConsumerFailed {
            consumer,
            failures,
            message,
        }) => {
            assert_eq!(consumer, "broken");
            assert_eq!(failures, 3);
            assert!(message.contains("the projection is broken"), "{message}");
        }
        other => panic!("expected ConsumerFailed, got {other:?}"),
    }
    assert_eq!(
        broken.calls.load(Ordering::SeqCst),
        3,
        "one event per failed batch"
    );
    assert_eq!(projected(&db, "broken").await, 0, "every batch rolled back");
    let cp: Option<i64> =
        sqlx::query_scalar("SELECT last_position FROM dbworker_consumer_checkpoints")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
    assert_eq!(cp.unwrap_or(0), 0, "the checkpoint never moved");
}

#[tokio::test]
async fn a_batch_past_its_timeout_is_rolled_back_and_counts_as_a_failure() {
    let db = set_up().await;
    append(&db, 5).await;
    let slow = Arc::new(Project {
        name: "slow".into(),
        calls: AtomicUsize::new(0),
        fail: false,
        slow: Duration::from_secs(5),
    });
    let mut o = fast_group();
    o.batch_timeout = Duration::from_millis(200);
    o.log.max_consecutive_failures = 2;
    let result = start(&db, vec![slow.clone()], o)
        .await
        .until_it_stops()
        .await;
    match result {
        Err(Error::ConsumerFailed {
            failures, message, ..
        }) => {
            assert_eq!(failures, 2);
            assert!(
                message.contains("exceeded maximum runtime of 200ms"),
                "{message}"
            );
        }
        other => panic!("expected ConsumerFailed, got {other:?}"),
    }
    assert_eq!(
        projected(&db, "slow").await,
        0,
        "the timed-out batches rolled back"
    );
}
