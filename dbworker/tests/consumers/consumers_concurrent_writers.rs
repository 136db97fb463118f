//! Log consumers under many concurrent writers whose transactions commit out
//! of position order, with a consumer process SIGKILLed and the server
//! restarted mid-run: every committed event is handled exactly once by every
//! consumer, and no event of a rolled-back transaction is handled at all.
//! Checked by SQL over what the consumers wrote in their slices'
//! transactions.
//!
//! Before consumers read in `(transaction, position)` order below the
//! snapshot's xmin, a slice could move a checkpoint past an event whose
//! transaction took its position earlier but committed later: that event was
//! never handled by anyone.

use crate::CLUSTER;
use crate::common;
use crate::fixtures::consumers as shared;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use dbworker::consumers::{Consumer, ConsumerGroup, Consumers};
use dbworker_testkit::ThrowawayServer;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use workerutil::BoxError;

use common::Db;
use shared::{Event, fast_group, fast_node};

const CHILD_URL: &str = "DBWORKER_CONCURRENT_WRITERS_URL";
const CONSUMERS: [&str; 3] = ["audit", "billing", "crm"];
const WRITERS: u64 = 8;

/// Records every event it is given in `handled`, in the slice's transaction.
struct Record(&'static str);
impl Consumer<Event> for Record {
    fn name(&self) -> &str {
        self.0
    }

    async fn handle(&self, tx: &mut PgConnection, event: &Event) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO handled (consumer, position) VALUES ($1, $2)")
            .bind(self.0)
            .bind(event.position())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// A consumer process: one node running the group's three consumers with
/// whatever share the leader assigns it, until it is killed.
#[tokio::test]
#[ignore = "run by the test below as a child process"]
async fn concurrent_writers_consumer_child() {
    let url = std::env::var(CHILD_URL).expect("the parent hands over the URL");
    let pool = PgPool::connect(&url).await.unwrap();
    let node = dbworker::cluster::Node::new(&pool, fast_node())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(node.clone().run(stop.clone()));
    let mut o = fast_group();
    o.node_id = node.id().to_owned();
    // The server restarts mid-run: a slice that fails then is retried, and
    // the group must not give up.
    o.log.max_consecutive_failures = 100_000;
    o.log.retry_after = Duration::from_millis(50);
    let consumers: Consumers<Event> = CONSUMERS.iter().map(|c| Record(c)).collect();
    let group = ConsumerGroup::new(&pool, o, consumers).await.unwrap();
    group.run(stop).await.unwrap();
}

/// A small deterministic generator, so a failing run can be repeated.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Appends events until `stop`: each transaction takes 1–3 positions, waits
/// a random 0–40 ms (so transactions commit out of position order), then
/// commits, or, one time in eight, rolls back. Errors (the server
/// restarting) lose only the transaction they hit.
async fn writer(pool: PgPool, seed: u64, stop: CancellationToken, committed: Arc<AtomicI64>) {
    let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    while !stop.is_cancelled() {
        let n = i64::try_from(rng.below(3) + 1).unwrap();
        let delay = Duration::from_millis(rng.below(40));
        let abort = rng.below(8) == 0;
        let attempt = async {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "INSERT INTO events (aggregate_type, aggregate_id, event_type) \
                 SELECT 'order', 'o' || i, 'placed' FROM generate_series(1, $1) AS i",
            )
            .bind(n)
            .execute(&mut *tx)
            .await?;
            tokio::time::sleep(delay).await;
            if abort {
                tx.rollback().await
            } else {
                tx.commit().await.map(|()| {
                    committed.fetch_add(n, Ordering::Relaxed);
                })
            }
        };
        if attempt.await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn spawn_consumer(url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            common::test_path(module_path!(), "concurrent_writers_consumer_child").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `(consumer, position)` pairs of committed events nobody handled.
async fn missing(pool: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT c.name, e.global_position FROM events e \
         CROSS JOIN unnest($1::text[]) AS c(name) \
         WHERE NOT EXISTS (SELECT 1 FROM handled h \
                           WHERE h.consumer = c.name AND h.position = e.global_position) \
         ORDER BY 2, 1",
    )
    .bind(CONSUMERS.map(String::from).to_vec())
    .fetch_all(pool)
    .await
}

#[tokio::test]
async fn every_event_is_handled_once_per_consumer_under_concurrent_writers_kills_and_a_restart() {
    let _cluster = CLUSTER.read().await;
    // A server of its own: restarting the shared one would break other tests.
    let server = tokio::task::spawn_blocking(|| ThrowawayServer::start(&[]))
        .await
        .unwrap();
    let server = match server {
        Ok(server) => server,
        Err(err) => {
            dbworker_testkit::skip(
                "the server-restart test",
                &format!("no PostgreSQL server of its own to restart here: {err}"),
            );
            return;
        }
    };
    let db = Db::on_server(server.admin_url()).await;
    shared::create_tables(&db).await;
    db.execute("CREATE TABLE handled (consumer text NOT NULL, position bigint NOT NULL)")
        .await;
    let url = db.db.url().to_owned();
    let mut children: Vec<Child> = (0..3).map(|_| spawn_consumer(&url)).collect();

    let stop_writing = CancellationToken::new();
    let committed = Arc::new(AtomicI64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|seed| {
            tokio::spawn(writer(
                db.pool.clone(),
                seed,
                stop_writing.clone(),
                committed.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    // SIGKILL one consumer process mid-slice; the others take its consumers
    // once the registry sees it dead.
    children[0].kill().unwrap();
    children[0].wait().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart().expect("restart");
        server
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_writing.cancel();
    for w in writers {
        w.await.unwrap();
    }

    // Every committed event reaches every consumer, however long the writers'
    // transactions kept it waiting.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let left = loop {
        let left = missing(&db.pool).await;
        match &left {
            Ok(left) if left.is_empty() => break Vec::new(),
            _ if tokio::time::Instant::now() > deadline => break left.unwrap_or_default(),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let twice: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT consumer, position, count(*) FROM handled GROUP BY 1, 2 HAVING count(*) > 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let phantom: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM handled h \
         WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.global_position = h.position)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let checkpoints: Vec<(String, i64)> = sqlx::query_as(
        "SELECT consumer_name, last_position FROM dbworker_consumer_checkpoints ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for child in &mut children[1..] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    println!(
        "{events} events committed ({} counted by the writers), checkpoints {checkpoints:?}",
        committed.load(Ordering::Relaxed)
    );
    assert!(events > 200, "the writers made too little: {events} events");
    assert!(
        left.is_empty(),
        "{} (consumer, event) pairs never handled, the first: {:?}",
        left.len(),
        &left[..left.len().min(10)]
    );
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(
        phantom, 0,
        "an event of a rolled-back transaction was handled"
    );
    drop(db);
    drop(server);
}
