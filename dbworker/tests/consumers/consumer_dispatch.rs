//! Log consumers and the log's head on real Postgres: a scoped consumer reads
//! only its aggregate types while its checkpoint passes the others; one
//! dispatcher per process reads the head for every idle consumer; in notify
//! mode an event whose NOTIFY was lost is still handled within the
//! reconciliation bound.

use crate::CLUSTER;
use crate::common;
use crate::fixtures::consumers as shared;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::Error;
use dbworker::cluster::Node;
use dbworker::consumers::{Consumer, ConsumerGroup, ConsumerGroupOptions, Consumers};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use workerutil::BoxError;

use shared::{Event, Project, fast_group, fast_node, projected, set_up, start, wait_for};

#[derive(Debug, sqlx::FromRow)]
struct Typed {
    global_position: i64,
    aggregate_type: String,
}

/// Reads only `order` events; fails the slice if it ever receives another type.
struct Orders {
    calls: AtomicUsize,
}
impl Consumer<Typed> for Orders {
    fn name(&self) -> &str {
        "orders"
    }

    fn aggregate_types(&self) -> Vec<String> {
        vec!["order".into()]
    }

    async fn handle(&self, tx: &mut PgConnection, event: &Typed) -> Result<(), BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if event.aggregate_type != "order" {
            return Err(format!("received a {} event", event.aggregate_type).into());
        }
        sqlx::query(
            "INSERT INTO projection (consumer, position, aggregate_id) VALUES ('orders', $1, '')",
        )
        .bind(event.global_position)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
}

/// Appends `n` events, every `every`-th an `order` and the others `invoice`;
/// returns the last position.
async fn append_mixed(db: &common::Db, n: i64, every: i64) -> i64 {
    sqlx::query_scalar(
        "WITH ins AS (INSERT INTO events (aggregate_type, aggregate_id, event_type) \
         SELECT CASE WHEN i % $2 = 0 THEN 'order' ELSE 'invoice' END, 'a' || i, 'x' \
         FROM generate_series(1, $1) AS i RETURNING global_position) SELECT max(global_position) FROM ins",
    )
    .bind(n)
    .bind(every)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn checkpoint(db: &common::Db, consumer: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(max(last_position), 0) FROM dbworker_consumer_checkpoints WHERE consumer_name = $1",
    )
    .bind(consumer)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A process running `consumer` in a group of its own.
struct Proc {
    stop: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), Error>>,
    beat: tokio::task::JoinHandle<()>,
}

async fn start_typed(db: &common::Db, consumer: Arc<Orders>) -> Proc {
    let pool = db.db.pool(6).await.unwrap();
    let node = Node::new(&pool, fast_node()).await.unwrap();
    let mut o = fast_group();
    o.name = "scoped".into();
    o.node_id = node.id().to_owned();
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.run(stop.clone()));
    let group = ConsumerGroup::<Typed>::new(&pool, o, Consumers::new().add(consumer))
        .await
        .unwrap();
    let run = tokio::spawn(group.run(stop.clone()));
    Proc { stop, run, beat }
}

impl Proc {
    async fn stop(self) {
        self.stop.cancel();
        self.run.await.unwrap().unwrap();
        self.beat.await.unwrap();
    }
}

#[tokio::test]
async fn a_scoped_consumer_reads_only_its_types_and_its_checkpoint_passes_the_others() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    // A log mostly of other types: 200 invoices first, then every tenth an
    // order, then 150 invoices last — far more than a slice (40) of others.
    append_mixed(&db, 200, 1_000_000).await;
    append_mixed(&db, 300, 10).await;
    let last = append_mixed(&db, 150, 1_000_000).await;
    let orders = Arc::new(Orders {
        calls: AtomicUsize::new(0),
    });
    let first = start_typed(&db, orders.clone()).await;
    wait_for("the checkpoint at the log's last event", async || {
        checkpoint(&db, "orders").await == last
    })
    .await;
    assert_eq!(orders.calls.load(Ordering::SeqCst), 30, "only the orders");
    assert_eq!(projected(&db, "orders").await, 30);
    first.stop().await;

    // A restart re-delivers nothing: the checkpoint is past every event.
    let again = Arc::new(Orders {
        calls: AtomicUsize::new(0),
    });
    let second = start_typed(&db, again.clone()).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        again.calls.load(Ordering::SeqCst),
        0,
        "nothing re-delivered"
    );
    assert_eq!(checkpoint(&db, "orders").await, last);
    // New events: only the new orders, and the checkpoint moves to the end.
    let last = append_mixed(&db, 20, 5).await;
    wait_for("the new end", async || {
        checkpoint(&db, "orders").await == last
    })
    .await;
    assert_eq!(again.calls.load(Ordering::SeqCst), 4);
    assert_eq!(projected(&db, "orders").await, 34);
    second.stop().await;
}

/// Index and sequential scans of the events table so far, once every backend
/// that used it has exited (a backend reports its counts when it ends).
async fn events_scans(db: &common::Db) -> i64 {
    let read = async || -> i64 {
        sqlx::query_scalar(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'events'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let mut last = read().await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = read().await;
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test]
async fn one_dispatcher_reads_the_head_for_every_idle_consumer_of_the_process() {
    let _alone = CLUSTER.write().await;
    let db = set_up().await;
    shared::append(&db, 2000).await;
    db.execute("ANALYZE events").await;
    let names: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    let consumers = |prefix: &str| -> Consumers<Event> {
        names
            .iter()
            .map(|n| Project::new(&format!("{prefix}{n}")))
            .collect()
    };
    // Two groups of eight consumers in one process, on the same log, polling
    // every 100 ms with no back-off: without a shared dispatcher each consumer
    // would probe the log every 100 ms.
    let interval = Duration::from_millis(100);
    let pool = db.db.pool(24).await.unwrap();
    let node = Node::new(&pool, fast_node()).await.unwrap();
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let mut groups = Vec::new();
    for g in ["g1", "g2"] {
        let mut o = fast_group();
        o.name = g.into();
        o.node_id = node.id().to_owned();
        o.log.listen = None; // poll mode
        o.log.slice_size = 1000;
        o.poll_interval = interval;
        o.max_poll_interval = interval;
        groups.push(
            ConsumerGroup::<Event>::new(&pool, o, consumers(g))
                .await
                .unwrap(),
        );
    }
    let dispatcher = groups[0].dispatcher().clone();
    assert!(
        dispatcher.same_as(groups[1].dispatcher()),
        "one per process and log"
    );
    let runs: Vec<_> = groups
        .into_iter()
        .map(|g| tokio::spawn(g.run(stop.clone())))
        .collect();
    for g in ["g1", "g2"] {
        for n in &names {
            let name = format!("{g}{n}");
            wait_for(&name, async || projected(&db, &name).await == 2000).await;
        }
    }
    let reads_before = dispatcher.head_reads();
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = idle_from.elapsed();
    let idle_reads = dispatcher.head_reads() - reads_before;
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    beat.await.unwrap();
    let reads = dispatcher.head_reads();
    drop(dispatcher);
    pool.close().await;

    let intervals = u64::try_from(idle.as_millis() / interval.as_millis()).unwrap();
    println!("{idle_reads} head reads in {idle:?} of idle ({intervals} intervals), {reads} in all");
    assert!(
        idle_reads <= intervals + 3 && idle_reads >= intervals / 2,
        "about one head read per interval: {idle_reads} in {intervals} intervals"
    );
    // What the database counted: every probe of the events table, by anyone,
    // over the whole run. The catch-up needs a few per consumer (the claim's
    // check, the slice, the check that finds it caught up); the idle time
    // needs only the head reads — not 16 consumers x 30 intervals. A head
    // read is two probes: the last final event, and whether committed events
    // wait behind a running writer.
    let scans = events_scans(&db).await;
    let consumers = 16;
    println!("{scans} scans of the events table in all");
    assert!(
        scans <= 2 * reads as i64 + 10 * consumers,
        "{scans} scans of the log: more than the {reads} head reads and the catch-up"
    );
}

#[tokio::test]
async fn an_event_whose_notify_was_lost_is_handled_within_the_reconcile_interval() {
    let _alone = CLUSTER.write().await;
    let mut bad = ConsumerGroupOptions::new("g", "events");
    bad.node_id = "n".into();
    bad.reconcile_interval = Duration::ZERO;
    assert!(
        matches!(
            bad.validate(),
            Err(Error::InvalidOption {
                field: "reconcile_interval",
                ..
            })
        ),
        "validated"
    );

    let db = set_up().await;
    let mut o = fast_group();
    o.log.listen = Some("events_appended".into()); // notify mode
    o.poll_interval = Duration::from_millis(50);
    o.reconcile_interval = Duration::from_millis(300);
    let p = start(&db, Consumers::new().add(Project::new("audit")), o).await;
    shared::append(&db, 5).await;
    wait_for("notified events", async || {
        projected(&db, "audit").await == 5
    })
    .await;
    // Idle long enough for any per-consumer back-off to have grown past the
    // bound (50 ms doubling: the next poll would come seconds later).
    tokio::time::sleep(Duration::from_millis(3300)).await;

    // An insert that bypasses the NOTIFY trigger: no notification is sent.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("ALTER TABLE events DISABLE TRIGGER events_notify")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO events (aggregate_type, aggregate_id, event_type) VALUES ('order', 'silent', 'x')")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE events ENABLE TRIGGER events_notify")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let inserted = Instant::now();
    wait_for("the silent event", async || {
        projected(&db, "audit").await == 6
    })
    .await;
    let took = inserted.elapsed();
    println!("a silent event handled after {took:?} (reconcile every 300 ms)");
    assert!(
        took < Duration::from_millis(1000),
        "handled within about the reconcile interval, took {took:?}"
    );
    p.stop().await.unwrap();
}

#[tokio::test]
async fn scopes_are_validated_and_need_the_type_column() {
    let _cluster = CLUSTER.read().await;
    use dbworker::consumers::{LogOptions, LogStore};
    let db = set_up().await;
    let mut o = LogOptions::new("log", "events e", "node-a", vec!["orders".into()]);
    o.scopes.insert("billing".into(), vec!["order".into()]);
    assert!(matches!(
        o.validate(),
        Err(Error::InvalidOption {
            field: "scopes",
            ..
        })
    ));
    o.scopes.clear();
    o.scopes.insert("orders".into(), vec!["order".into()]);
    o.aggregate_type_column = "kind".into();
    let err = LogStore::<Typed>::new(&db.pool, o).await.unwrap_err();
    assert!(err.to_string().contains("kind"), "{err}");
}
