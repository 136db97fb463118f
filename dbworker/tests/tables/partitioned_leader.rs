//! A purger running as leader on a partitioned table: creating and dropping
//! partitions is fenced by its term, so a leader deposed in the middle of a
//! pass (as one paused past its lease would be) drops and creates nothing,
//! and the pass says why; the new leader's pass does the work.
//!
//! Before the fence, the deposed leader dropped the partition it had begun
//! with and created partitions after another node led. A leader's batch that
//! would hold the lease row past a third of the lease is cut off.

use crate::common;

use std::time::Duration;

use dbworker::Error;
use dbworker::cluster::{DEFAULT_LEADER_TABLE, LeaderElection, LeaderOptions, Leadership};
use dbworker::ddl::leader_table_sql;
use dbworker::maintenance::Purger;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::partitioned::{finished_but_three, jobs, partitions, purger_options};
use common::Db;

/// `node` leads the table's scope until `stop` fires; its term, and the
/// election's task (which releases the lease once stopped).
async fn lead(db: &Db, node: &str, stop: &CancellationToken) -> (Leadership, JoinHandle<()>) {
    lead_with(db, LeaderOptions::new("jobs", node), stop).await
}

/// [`lead`] with the election's options.
async fn lead_with(
    db: &Db,
    options: LeaderOptions,
    stop: &CancellationToken,
) -> (Leadership, JoinHandle<()>) {
    let election = LeaderElection::new(&db.pool, options).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = stop.clone();
    let run = tokio::spawn(async move {
        election
            .run(stop, move |leadership| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(leadership.clone());
                    leadership.cancelled().await;
                }
            })
            .await;
    });
    let leadership = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("led within 10 s")
        .unwrap();
    (leadership, run)
}

#[tokio::test]
async fn a_deposed_leader_neither_drops_nor_creates_partitions() {
    let db = Db::partitioned().await;
    db.execute(&leader_table_sql(DEFAULT_LEADER_TABLE).unwrap())
        .await;
    finished_but_three(&db).await;
    let table = jobs(&db).await;
    let before = partitions(&db).await;
    // The oldest partition (nine days back), every row purgeable: the first
    // the pass drops. An open lock on it holds the pass's listing (which
    // reads every partition's bounds) until B leads.
    let oldest: String = sqlx::query_scalar(
        "SELECT tableoid::regclass::text FROM jobs WHERE queued_at::date = (now() - interval '9 days')::date LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut blocker = db.pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {oldest} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *blocker)
    .await
    .unwrap();

    // Node A leads and begins a pass, which waits on the lock...
    let stop_a = CancellationToken::new();
    let (a, run_a) = lead(&db, "node-a", &stop_a).await;
    let purger = Purger::new(&db.pool, &table, purger_options())
        .await
        .unwrap();
    let pass = {
        let (purger, a) = (purger.clone(), a.clone());
        tokio::spawn(async move { purger.purge_once_as_leader(&a).await })
    };
    db.await_lock_wait("%dbworker_own%", "the pass never listed the partitions")
        .await;
    // ...while node B takes over in a newer term.
    stop_a.cancel();
    run_a.await.unwrap();
    let stop_b = CancellationToken::new();
    let (b, run_b) = lead(&db, "node-b", &stop_b).await;
    assert!(b.term() > a.term());

    // A's pass goes on: its drop is refused by the fence, and says so.
    blocker.commit().await.unwrap();
    let out = pass.await.unwrap();
    assert!(
        matches!(out, Err(Error::LeadershipLost { term, .. }) if term == a.term()),
        "{out:?}"
    );
    assert_eq!(partitions(&db).await, before, "A dropped nothing");

    // A deposed leader creates nothing either.
    let mut ahead = purger_options();
    ahead.partitions_ahead = 6;
    let purger = Purger::new(&db.pool, &table, ahead).await.unwrap();
    let out = purger.purge_once_as_leader(&a).await;
    assert!(matches!(out, Err(Error::LeadershipLost { .. })), "{out:?}");
    assert_eq!(partitions(&db).await, before, "A created nothing");

    // The current leader's pass creates and drops.
    let purged = purger.purge_once_as_leader(&b).await.unwrap();
    assert_eq!(purged.partitions_created.len(), 3, "{purged:?}");
    assert_eq!(purged.partitions_dropped.len(), 6, "{purged:?}");
    assert!(
        purged
            .partitions_dropped
            .iter()
            .any(|p| p.name.ends_with(oldest.as_str())),
        "{purged:?}"
    );
    assert!(!partitions(&db).await.contains(&oldest));
    stop_b.cancel();
    run_b.await.unwrap();
}

/// A leader's batch holds the lease row its renewals wait for: one slower
/// than a third of the lease (no retention index on a large table; here, a
/// lock a report holds on the table) is cut off, and the pass fails saying
/// why, rather than the leader stepping down at every pass.
#[tokio::test]
async fn a_batch_slower_than_a_third_of_the_lease_is_cut_off_and_the_leader_stays() {
    let db = Db::partitioned().await;
    db.execute(&leader_table_sql(DEFAULT_LEADER_TABLE).unwrap())
        .await;
    let mut o = LeaderOptions::new("jobs", "node-a");
    o.lease = Duration::from_secs(3);
    let stop = CancellationToken::new();
    let (a, run) = lead_with(&db, o, &stop).await;
    let mut po = purger_options();
    po.detach_lock_timeout = Duration::from_millis(100);
    let purger = Purger::new(&db.pool, &jobs(&db).await, po).await.unwrap();
    let mut report = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE jobs IN SHARE MODE")
        .execute(&mut *report)
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), purger.purge_once_as_leader(&a))
        .await
        .expect("the batch is cut off within a third of the lease");
    let err = out.unwrap_err().to_string();
    assert!(err.contains("a third of the leader's lease"), "{err}");
    // Two more thirds: a renewal held up by the batch would have deposed it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!a.token().is_cancelled(), "the leader stays");
    report.rollback().await.unwrap();
    stop.cancel();
    run.await.unwrap();
}
