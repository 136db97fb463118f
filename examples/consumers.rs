//! Checkpointed log consumers survive SIGKILL with exactly-once effects: a
//! child process runs a consumer group (two consumers writing a projection in
//! each slice's transaction) over 3,000 events and is killed with SIGKILL
//! mid-way; what it committed matches its checkpoints exactly; a second child
//! takes over from the checkpoints, and every event ends up projected exactly
//! once per consumer.
//!
//! ```sh
//! cargo run --example consumers
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbworker::{
    cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, Node, NodeOptions},
    consumers::{
        Consumer, ConsumerGroup, ConsumerGroupOptions, Consumers, DEFAULT_ASSIGNMENT_TABLE,
        DEFAULT_CHECKPOINT_TABLE,
    },
    ddl::{consumer_tables_sql, events_table_sql, leader_table_sql, node_table_sql},
};
use dbworker_testkit::TestDatabase;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use workerutil::BoxError;

const EVENTS: i64 = 3000;

#[derive(Debug, sqlx::FromRow)]
struct Event {
    global_position: i64,
}

/// Writes one projection row per event, in the slice's transaction (no
/// unique key: a second row for a position would show a double effect).
struct Project(&'static str);
impl Consumer<Event> for Project {
    fn name(&self) -> &str {
        self.0
    }

    async fn handle(&self, tx: &mut PgConnection, event: &Event) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO projection (consumer, position) VALUES ($1, $2)")
            .bind(self.0)
            .bind(event.global_position)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        // Slow enough that the kill lands mid-way.
        tokio::time::sleep(Duration::from_micros(300)).await;
        Ok(())
    }
}

/// The child: runs the group until every checkpoint reaches the end.
async fn child(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(6)
        .connect(url)
        .await?;
    let mut no = NodeOptions::default();
    no.heartbeat_interval = Duration::from_millis(100);
    no.dead_after = Duration::from_millis(500);
    let node = Node::new(&pool, no).await?;
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let mut go = ConsumerGroupOptions::new("projections", "events");
    go.node_id = node.id().to_owned();
    go.dead_after = Duration::from_millis(500);
    go.lease = Duration::from_millis(600);
    go.rebalance_interval = Duration::from_millis(100);
    go.poll_interval = Duration::from_millis(50);
    go.log.slice_size = 50;
    go.log.slice_pause = Duration::ZERO;
    let consumers = Consumers::new()
        .add(Project("audit"))
        .add(Project("totals"));
    let group = ConsumerGroup::new(&pool, go, consumers).await?;
    let run = tokio::spawn(group.run(stop.clone()));
    while checkpoints(&pool).await? != [EVENTS, EVENTS] {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await??;
    beat.await?;
    pool.close().await;
    Ok(())
}

async fn checkpoints(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let mut cps: Vec<i64> = sqlx::query_scalar(
        "SELECT last_position FROM dbworker_consumer_checkpoints ORDER BY consumer_name",
    )
    .persistent(false)
    .fetch_all(&mut *pool.begin().await?)
    .await?;
    cps.resize(2, 0);
    Ok(cps)
}

/// Per consumer: projection rows, distinct positions, checkpoint.
async fn tally(pool: &PgPool) -> Result<Vec<(String, i64, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT c.consumer_name, count(p.position), count(DISTINCT p.position), c.last_position \
         FROM dbworker_consumer_checkpoints c LEFT JOIN projection p ON p.consumer = c.consumer_name \
         GROUP BY c.consumer_name, c.last_position ORDER BY 1",
    )
    .persistent(false)
    .fetch_all(&mut *pool.begin().await?)
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url] = args.as_slice()
        && flag == "--child"
    {
        return child(url).await;
    }

    let db = TestDatabase::new().await?;
    let pool = db.pool(4).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "{}{}{}{}CREATE TABLE projection (consumer text NOT NULL, position bigint NOT NULL);
         INSERT INTO events (aggregate_type, aggregate_id, event_type)
         SELECT 'order', 'o' || i, 'placed' FROM generate_series(1, {EVENTS}) AS i;",
        node_table_sql(DEFAULT_NODE_TABLE)?,
        leader_table_sql(DEFAULT_LEADER_TABLE)?,
        consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE)?,
        events_table_sql("events", "events_appended")?,
    )))
    .execute(&pool)
    .await?;

    let me = std::env::current_exe()?;
    let mut doomed = Command::new(&me)
        .args(["--child", db.url()])
        .stdout(Stdio::null())
        .spawn()?;
    let start = Instant::now();
    loop {
        let done: i64 = checkpoints(&pool).await?.iter().sum();
        if done >= EVENTS / 2 {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err("the first child made no progress".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    doomed.kill()?; // SIGKILL, mid-slice: no chance to clean up.
    doomed.wait()?;
    println!("[parent] killed the first child with SIGKILL mid-way");
    for (consumer, rows, distinct, checkpoint) in tally(&pool).await? {
        let whole = if rows == checkpoint && distinct == rows {
            "yes"
        } else {
            "NO"
        };
        println!(
            "after the kill: {consumer}: checkpoint {checkpoint}, rows {rows}, committed effects match the checkpoint: {whole}"
        );
    }

    let status = Command::new(&me)
        .args(["--child", db.url()])
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("the second child failed: {status}").into());
    }
    for (consumer, rows, distinct, checkpoint) in tally(&pool).await? {
        println!(
            "at the end: {consumer}: checkpoint {checkpoint}, rows {rows}, distinct positions {distinct}"
        );
    }
    pool.close().await;
    Ok(())
}
