//! A group's consumers go only to processes that run that group: a process
//! registered in the same node registry for something else (a job worker, a
//! node for the resetter's rescue, another group) gets none of them.

use crate::CLUSTER;
use crate::fixtures::consumers as shared;

use dbworker::cluster::Node;
use dbworker::consumers::Consumers;
use tokio_util::sync::CancellationToken;

use shared::{
    Event, Project, append, assignments, fast_group, fast_node, projected, set_up, start, wait_for,
};

#[tokio::test]
async fn a_process_that_runs_no_group_in_the_registry_gets_no_consumers() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    // A live process of the registry that runs no consumers, heartbeating.
    let other = Node::new(&db.pool, fast_node()).await.unwrap();
    let stop_other = CancellationToken::new();
    let beat = tokio::spawn(other.clone().run(stop_other.clone()));

    let names = ["a", "b", "c", "d"];
    let consumers = || -> Consumers<Event> { names.iter().map(|n| Project::new(n)).collect() };
    let first = start(&db, consumers(), fast_group()).await;
    let second = start(&db, consumers(), fast_group()).await;
    let group = [first.node.id().to_owned(), second.node.id().to_owned()];
    // Every consumer on a process of the group, each with its share (two).
    wait_for("two consumers on each process of the group", async || {
        let a = assignments(&db).await;
        a.len() == 4
            && group
                .iter()
                .all(|id| a.iter().filter(|(_, n)| n == id).count() == 2)
    })
    .await;
    assert!(assignments(&db).await.iter().all(|(_, n)| n != other.id()));

    append(&db, 60).await;
    for name in names {
        wait_for(name, async || projected(&db, name).await == 60).await;
    }
    // A graceful stop leaves the group at once: its consumers go back to
    // the other member (not to the registry's other process).
    let second_id = second.node.id().to_owned();
    second.stop().await.unwrap();
    let members: Vec<String> =
        sqlx::query_scalar("SELECT node_id FROM dbworker_consumer_members ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(members, [first.node.id().to_owned()]);
    wait_for("all four back on the first", async || {
        let a = assignments(&db).await;
        a.iter().all(|(_, n)| n == first.node.id())
    })
    .await;
    assert!(assignments(&db).await.iter().all(|(_, n)| *n != second_id));
    first.stop().await.unwrap();
    stop_other.cancel();
    beat.await.unwrap();
}

#[tokio::test]
async fn two_groups_sharing_the_registry_keep_their_consumers_on_their_own_processes() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let mut reports = fast_group();
    reports.name = "reports".into();
    let projections = start(
        &db,
        Consumers::new()
            .add(Project::new("a"))
            .add(Project::new("b")),
        fast_group(),
    )
    .await;
    let reporting = start(
        &db,
        Consumers::new()
            .add(Project::new("c"))
            .add(Project::new("d")),
        reports,
    )
    .await;
    let expected: Vec<(String, String)> = [
        ("a", projections.node.id()),
        ("b", projections.node.id()),
        ("c", reporting.node.id()),
        ("d", reporting.node.id()),
    ]
    .iter()
    .map(|(c, n)| ((*c).to_owned(), (*n).to_owned()))
    .collect();
    wait_for("each group's consumers on its own process", async || {
        assignments(&db).await == expected
    })
    .await;

    append(&db, 60).await;
    for name in ["a", "b", "c", "d"] {
        wait_for(name, async || projected(&db, name).await == 60).await;
    }
    projections.stop().await.unwrap();
    reporting.stop().await.unwrap();
}

/// A process whose group task is gone while its node still heartbeats in
/// the registry loses its consumers once its membership is stale.
#[tokio::test]
async fn a_process_whose_group_died_but_node_lives_loses_its_consumers() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let names = ["a", "b", "c", "d"];
    let consumers = || -> Consumers<Event> { names.iter().map(|n| Project::new(n)).collect() };
    let first = start(&db, consumers(), fast_group()).await;
    let second = start(&db, consumers(), fast_group()).await;
    let second_id = second.node.id().to_owned();
    wait_for("two each", async || {
        assignments(&db)
            .await
            .iter()
            .filter(|(_, n)| *n == second_id)
            .count()
            == 2
    })
    .await;
    let (stop_beat, beat) = second.abort_group();
    wait_for("all four back on the first", async || {
        let a = assignments(&db).await;
        a.len() == 4 && a.iter().all(|(_, n)| n == first.node.id())
    })
    .await;
    append(&db, 30).await;
    for name in names {
        wait_for(name, async || projected(&db, name).await == 30).await;
    }
    first.stop().await.unwrap();
    stop_beat.cancel();
    beat.await.unwrap();
}

/// An installation made before the members table existed is refused at
/// start-up, naming the table and the migration that creates it.
#[tokio::test]
async fn a_group_without_the_members_table_names_the_migration() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    db.execute("DROP TABLE dbworker_consumer_members").await;
    let node = Node::new(&db.pool, fast_node()).await.unwrap();
    let mut group = fast_group();
    group.node_id = node.id().to_owned();
    let err = dbworker::consumers::ConsumerGroup::<Event>::new(
        &db.pool,
        group,
        Consumers::new().add(Project::new("a")),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("dbworker_consumer_members"), "{err}");
    assert!(err.contains("dbworker migration --consumers"), "{err}");
}

/// A group whose first membership beat fails (the database away for a
/// moment as it starts) does not stop: the refresh joins it once it can, and
/// its consumers run.
#[tokio::test]
async fn a_group_whose_first_beat_fails_joins_once_it_can() {
    let _cluster = CLUSTER.read().await;
    let db = set_up().await;
    let pool = db.db.pool(8).await.unwrap();
    let node = Node::new(&pool, fast_node()).await.unwrap();
    let mut options = fast_group();
    options.node_id = node.id().to_owned();
    let stop = CancellationToken::new();
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let group = dbworker::consumers::ConsumerGroup::new(
        &pool,
        options,
        Consumers::new().add(Project::new("a")),
    )
    .await
    .unwrap();
    db.execute("ALTER TABLE dbworker_consumer_members RENAME TO members_away")
        .await;
    let run = tokio::spawn(group.run(stop.clone()));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!run.is_finished(), "the group stopped: {:?}", run.await);
    db.execute("ALTER TABLE members_away RENAME TO dbworker_consumer_members")
        .await;
    append(&db, 20).await;
    wait_for("the consumer of the group that joined late", async || {
        projected(&db, "a").await == 20
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    beat.await.unwrap();
}
