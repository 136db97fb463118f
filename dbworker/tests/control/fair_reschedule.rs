//! Fair claims and an operator's reschedule of a job that still waits (no
//! change of state): moved later, it waits untagged like any job not yet
//! due, and once due it is tagged at the back of its key's share.
//!
//! Before, the job kept the tag it had (the tagging trigger fired only on a
//! change of state): scheduled an hour out, it kept its place at the front
//! of the line it no longer stood in, and took it back when due.

use crate::TIMED;
use crate::common;

use std::time::{Duration, SystemTime};

use dbworker::admin::{Admin, BulkAction, Reschedule};
use dbworker::{Enqueuer, NewJob};

use common::Db;

/// `FAIR_UNTAGGED`: the tag of a job waiting for its run-at.
const UNTAGGED: i64 = 1 << 62;

async fn tag(db: &Db, id: i64) -> i64 {
    db.scalar("SELECT fair_tag FROM jobs WHERE id = $1", id)
        .await
}

#[tokio::test]
async fn a_rescheduled_waiting_job_is_untagged_until_due_and_then_goes_to_the_back() {
    let _shared = TIMED.read().await;
    let db = crate::fairness::fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let mut ids = Vec::new();
    for key in ["a", "b", "a", "b", "a", "b"] {
        ids.push(
            enqueuer
                .enqueue(NewJob::new().fair_key(key))
                .await
                .unwrap()
                .id(),
        );
    }
    let first = ids[0];
    assert_eq!(tag(&db, first).await, 0, "tagged at the front");
    let admin = Admin::new(&db.pool, &table).await.unwrap();

    // An hour out: not due, so untagged, behind every tagged job.
    let mut later = Reschedule::default();
    later.run_after = Some(Duration::from_secs(3600));
    let done = admin
        .act_on_ids(&[first], &BulkAction::Reschedule(later))
        .await
        .unwrap();
    assert_eq!(done, 1);
    assert_eq!(db.state(first).await, "queued");
    assert_eq!(tag(&db, first).await, UNTAGGED);

    // Back to now: due, and tagged as every job come due is (a worker's
    // claims set its tag to -1), after the other jobs of its key.
    let mut now = Reschedule::default();
    now.run_at = Some(SystemTime::now() - Duration::from_secs(1));
    admin
        .act_on_ids(&[first], &BulkAction::Reschedule(now))
        .await
        .unwrap();
    assert_eq!(
        tag(&db, first).await,
        UNTAGGED,
        "not tagged before it is due"
    );
    db.execute(&format!(
        "UPDATE jobs SET fair_tag = -1 WHERE id = {first} AND process_after <= now()"
    ))
    .await;
    let tags: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, fair_key, fair_tag FROM jobs WHERE fair_key = 'a' ORDER BY fair_tag, id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(tags.iter().all(|(_, _, t)| *t < UNTAGGED), "{tags:?}");
    assert_eq!(tags.last().unwrap().0, first, "{tags:?}");
    assert!(tags.last().unwrap().2 > tags[tags.len() - 2].2, "{tags:?}");
}

/// A job waiting out its retry's backoff waits untagged; an operator's
/// requeue clears its run-at without a change of waiting state (errored to
/// queued), which no trigger sees: the next tagging pass of a worker's
/// claims tags it all the same, instead of leaving it behind every tagged
/// job of its level for good.
#[tokio::test]
async fn a_requeued_job_waiting_out_its_backoff_is_tagged_by_the_next_claims() {
    let _shared = TIMED.read().await;
    let db = crate::fairness::fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let backing_off = enqueuer
        .enqueue(NewJob::new().fair_key("a"))
        .await
        .unwrap()
        .id();
    db.execute(&format!(
        "UPDATE jobs SET state = 'processing' WHERE id = {backing_off};
         UPDATE jobs SET state = 'errored', process_after = now() + interval '1 hour' WHERE id = {backing_off}"
    ))
    .await;
    assert_eq!(
        tag(&db, backing_off).await,
        UNTAGGED,
        "its retry is not due"
    );
    let admin = Admin::new(&db.pool, &table).await.unwrap();
    let done = admin
        .act_on_ids(&[backing_off], &BulkAction::Requeue)
        .await
        .unwrap();
    assert_eq!(done, 1);
    let cleared: bool = db
        .scalar(
            "SELECT process_after IS NULL FROM jobs WHERE id = $1",
            backing_off,
        )
        .await;
    assert!(cleared, "the requeue clears the run-at");
    let other = enqueuer
        .enqueue(NewJob::new().fair_key("b"))
        .await
        .unwrap()
        .id();
    let store = db.store(dbworker::Handling::Heartbeat).await;
    let claimed = workerutil::Store::dequeue(&*store, "host", &Default::default(), 1)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let claimed = workerutil::Job::lease(&claimed[0]).id;
    if claimed != backing_off {
        assert_eq!(claimed, other);
        assert!(
            tag(&db, backing_off).await < UNTAGGED,
            "the requeued job was left untagged, behind every tagged job"
        );
    }
}
