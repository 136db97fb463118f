//! The log consumer tests' events, consumer and processes, shared by
//! dbworker/tests/consumers/consumers.rs and dbworker-cli/tests/services/consumers.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    Error,
    cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, Node, NodeOptions},
    consumers::{
        Consumer, ConsumerGroup, ConsumerGroupOptions, Consumers, DEFAULT_ASSIGNMENT_TABLE,
        DEFAULT_CHECKPOINT_TABLE,
    },
    ddl::{consumer_tables_sql, events_table_sql, leader_table_sql, node_table_sql},
};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use workerutil::BoxError;

use crate::common::Db;

#[derive(Debug, sqlx::FromRow)]
pub struct Event {
    global_position: i64,
    aggregate_id: String,
}

/// Records each event it sees in `projection`, in the slice's transaction.
pub struct Project {
    pub name: String,
    pub calls: AtomicUsize,
    pub fail: bool,
    /// Takes this long per event.
    pub slow: Duration,
}

impl Project {
    pub fn new(name: &str) -> Arc<Project> {
        Arc::new(Project {
            name: name.into(),
            calls: AtomicUsize::new(0),
            fail: false,
            slow: Duration::ZERO,
        })
    }
}
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
        // Unnamed, so it also runs behind a transaction pooler.
        .persistent(false)
        .execute(&mut *tx)
        .await?;
        tokio::time::sleep(self.slow).await;
        if self.fail {
            return Err("the projection is broken".into());
        }
        Ok(())
    }
}

impl Event {
    pub fn position(&self) -> i64 {
        self.global_position
    }
}

pub async fn set_up() -> Db {
    let db = Db::new().await;
    create_tables(&db).await;
    db
}

/// The registry, lease, consumer, events and projection tables.
pub async fn create_tables(db: &Db) {
    db.execute(&format!(
        "{}{}{}{}
         CREATE TABLE projection (consumer text, position bigint, aggregate_id text, PRIMARY KEY (consumer, position));",
        node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap(),
        consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE).unwrap(),
        events_table_sql("events", "events_appended").unwrap(),
    ))
    .await;
}

pub async fn append(db: &Db, n: i64) {
    sqlx::query(
        "INSERT INTO events (aggregate_type, aggregate_id, event_type) \
         SELECT 'order', 'o' || i, 'placed' FROM generate_series(1, $1) AS i",
    )
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
    wait_until_final(db).await;
}

/// Waits until every committed event is below the horizon consumers read up
/// to: a transaction elsewhere in the cluster (another test's slice) may hold
/// it back for a moment, and tests that claim by hand expect the events now.
pub async fn wait_until_final(db: &Db) {
    wait_for("the events to be final", async || {
        sqlx::query_scalar::<_, bool>(
            "SELECT NOT EXISTS (SELECT 1 FROM events              WHERE transaction_id >= pg_snapshot_xmin(pg_current_snapshot()))",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
    })
    .await;
}

pub fn fast_node() -> NodeOptions {
    let mut o = NodeOptions::default();
    o.heartbeat_interval = Duration::from_millis(50);
    o.dead_after = Duration::from_millis(400);
    o
}

pub fn fast_group() -> ConsumerGroupOptions {
    let mut o = ConsumerGroupOptions::new("projections", "events e");
    o.dead_after = Duration::from_millis(400);
    o.lease = Duration::from_millis(600);
    o.rebalance_interval = Duration::from_millis(100);
    o.poll_interval = Duration::from_millis(50);
    o.log.slice_size = 40;
    o.log.slice_pause = Duration::from_millis(5);
    o.log.retry_after = Duration::from_millis(20);
    o.log.listen = Some("events_appended".into());
    o
}

/// A process: a node, its heartbeats and its part of the group.
pub struct Process {
    pub node: Node,
    stop: CancellationToken,
    beat: tokio::task::JoinHandle<()>,
    run: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Process {
    /// Dies without a word, as with SIGKILL: no deregistration, no release.
    pub fn kill(self) {
        self.beat.abort();
        self.run.abort();
    }

    /// The group's task is aborted while the node keeps heartbeating (a
    /// process whose group died but whose registry row lives on); returns
    /// the heartbeat's stop.
    pub fn abort_group(self) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        self.run.abort();
        (self.stop, self.beat)
    }

    /// Waits for the group to stop by itself (a consumer kept failing).
    pub async fn until_it_stops(self) -> Result<(), Error> {
        let result = tokio::time::timeout(Duration::from_secs(20), self.run)
            .await
            .expect("the group stops by itself")
            .unwrap();
        self.stop.cancel();
        self.beat.await.unwrap();
        result
    }

    pub async fn stop(self) -> Result<(), Error> {
        self.stop.cancel();
        let result = self.run.await.unwrap();
        self.beat.await.unwrap();
        result
    }
}

pub async fn start(db: &Db, consumers: Consumers<Event>, group: ConsumerGroupOptions) -> Process {
    start_on(db.db.pool(8).await.unwrap(), consumers, group).await
}

/// [`start`] on `pool` (a pool through a pooler, say).
pub async fn start_on(
    pool: sqlx::PgPool,
    consumers: Consumers<Event>,
    mut group: ConsumerGroupOptions,
) -> Process {
    let node = Node::new(&pool, fast_node()).await.unwrap();
    group.node_id = node.id().to_owned();
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let group = ConsumerGroup::new(&pool, group, consumers).await.unwrap();
    let run = tokio::spawn(group.run(stop.clone()));
    Process {
        node,
        stop,
        beat,
        run,
    }
}

pub async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn projected(db: &Db, consumer: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM projection WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

pub async fn assignments(db: &Db) -> Vec<(String, String)> {
    sqlx::query_as("SELECT consumer_name, node_id FROM dbworker_consumer_assignments ORDER BY 1")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}
