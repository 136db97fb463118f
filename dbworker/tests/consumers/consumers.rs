//! Checkpointed log consumers on real Postgres: assignments rebalanced when
//! processes join and die, a process that lost a consumer unable to advance its
//! checkpoint, and a consumer that keeps failing stopping its group. Every event
//! handled once per consumer with its writes, and `dbworker status` showing the
//! lag: dbworker-cli/tests/services/consumers.rs.

use crate::CLUSTER;
use crate::fixtures::consumers as shared;
use crate::fixtures::grants as roles;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    Error,
    consumers::{Consumers, LogOptions, LogStore},
};
use workerutil::{Job, Store};

use roles::{Grants, drop_role, each_grant_is_needed, role_with};
use shared::{
    Event, Project, append, assignments, fast_group, fast_node, projected, set_up, start, start_on,
    wait_for,
};

#[tokio::test]
async fn consumers_are_rebalanced_when_processes_join_and_die() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let names = ["a", "b", "c", "d"];
    let consumers = || -> Consumers<Event> { names.iter().map(|n| Project::new(n)).collect() };
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
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    append(&db, 10).await;
    let mut o = LogOptions::new("log", "events e", "node-a", vec!["audit".into()]);
    o.slice_size = 5;
    o.slice_pause = Duration::ZERO;
    let store = LogStore::<Event>::new(&db.db.pool(4).await.unwrap(), o)
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

    // Opened while assigned: the slice holds the assignment row, so a
    // reassignment waits for the slice and cannot steal it (and the leader's
    // rebalance skips the row until the slice ends).
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
    assert!(blocked.is_err(), "the reassignment waits for the slice");
    assert!(store.mark_complete(&mut job).await.unwrap());
    assert_eq!(checkpoint().await, Some(5));

    // A late write from a slice whose checkpoint moved on is fenced off.
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
    let _cluster = CLUSTER.read().await;
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
    let result = start(&db, Consumers::new().add(broken.clone()), o)
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
        "one event per failed slice"
    );
    assert_eq!(projected(&db, "broken").await, 0, "every slice rolled back");
    let cp: Option<i64> =
        sqlx::query_scalar("SELECT last_position FROM dbworker_consumer_checkpoints")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
    assert_eq!(cp.unwrap_or(0), 0, "the checkpoint never moved");
}

#[tokio::test]
async fn a_slice_past_its_timeout_is_rolled_back_and_counts_as_a_failure() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    append(&db, 5).await;
    let slow = Arc::new(Project {
        name: "slow".into(),
        calls: AtomicUsize::new(0),
        fail: false,
        slow: Duration::from_secs(5),
    });
    let mut o = fast_group();
    o.slice_timeout = Duration::from_millis(200);
    o.log.max_consecutive_failures = 2;
    let result = start(&db, Consumers::new().add(slow.clone()), o)
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
        "the timed-out slices rolled back"
    );
}

// A group's process, as the operations manual lists its grants: its node,
// the leader's lease, the log and the group's own tables (the consumers'
// own writes, the projection here, are the application's).
const GROUP: Grants = Grants(&[
    "SELECT ON dbworker_nodes",
    "INSERT ON dbworker_nodes",
    "UPDATE ON dbworker_nodes",
    "DELETE ON dbworker_nodes",
    "SELECT ON dbworker_leaders",
    "INSERT ON dbworker_leaders",
    "UPDATE ON dbworker_leaders",
    "SELECT ON events",
    "SELECT ON dbworker_consumer_checkpoints",
    "INSERT ON dbworker_consumer_checkpoints",
    "UPDATE ON dbworker_consumer_checkpoints",
    "SELECT ON dbworker_consumer_assignments",
    "INSERT ON dbworker_consumer_assignments",
    "UPDATE ON dbworker_consumer_assignments",
    "SELECT ON dbworker_consumer_members",
    "INSERT ON dbworker_consumer_members",
    "UPDATE ON dbworker_consumer_members",
    "DELETE ON dbworker_consumer_members",
]);

#[tokio::test]
async fn a_group_runs_with_its_documented_grants_and_names_a_missing_one() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let mut grants = GROUP.0.to_vec();
    grants.push("INSERT ON projection");
    let (name, pool) = role_with(&db, &grants).await;
    let process = start_on(
        pool.clone(),
        Consumers::new().add(Project::new("a")),
        fast_group(),
    )
    .await;
    append(&db, 50).await;
    wait_for("the projection", async || projected(&db, "a").await == 50).await;
    process.stop().await.unwrap();
    drop_role(&db, pool, &name).await;

    each_grant_is_needed(&db, &GROUP, |pool| async move {
        let node = dbworker::cluster::Node::new(&pool, fast_node()).await?;
        let mut group = fast_group();
        group.node_id = node.id().to_owned();
        let consumers = Consumers::new().add(Project::new("a"));
        dbworker::consumers::ConsumerGroup::new(&pool, group, consumers).await?;
        Ok(())
    })
    .await;
}

/// The group passes its times to the worker it builds (`poll_interval` as
/// its poll, `rebalance_interval` as its heartbeat): a value the worker
/// refuses is refused by the group, naming the group's field, not the
/// worker's (`interval`, `heartbeat_failure_limit`) the user never set.
/// The worker's bounds themselves are accepted.
#[tokio::test]
async fn a_group_time_the_worker_refuses_is_named_by_the_group() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let group = |set: &dyn Fn(&mut dbworker::consumers::ConsumerGroupOptions)| {
        let mut o = fast_group();
        o.node_id = "n".into();
        set(&mut o);
        let pool = db.pool.clone();
        async move {
            let consumers = Consumers::new().add(Project::new("audit"));
            dbworker::consumers::ConsumerGroup::new(&pool, o, consumers).await
        }
    };
    type Set = Box<dyn Fn(&mut dbworker::consumers::ConsumerGroupOptions)>;
    let refused: Vec<(&str, Set)> = vec![
        (
            "poll_interval",
            Box::new(|o| o.poll_interval = Duration::from_millis(5)),
        ),
        (
            "rebalance_interval",
            Box::new(|o| o.rebalance_interval = Duration::from_secs(16)),
        ),
    ];
    for (field, set) in &refused {
        match group(set).await {
            Err(Error::InvalidOption { field: f, reason }) => {
                assert_eq!(f, *field, "{reason}");
            }
            other => panic!("{field}: expected an error, got {:?}", other.err()),
        }
    }
    group(&|o| {
        o.poll_interval = Duration::from_millis(10);
        o.rebalance_interval = Duration::from_secs(15);
    })
    .await
    .unwrap();
}
