//! The snooze case of the conformance suite.

use super::{Harness, dequeue, no_conditions};
use crate::state::JobState;
use crate::store::Store;

/// A snoozed job is queued again, not claimable before its delay, and its
/// snooze counts no failure.
pub async fn snooze_waits_without_a_failure<H: Harness>(h: &H) {
    let store = h.new_store(1).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    let delay = std::time::Duration::from_millis(400);
    assert!(
        store.mark_snoozed(&mut job, delay).await.unwrap(),
        "snooze: mark"
    );
    assert_eq!(h.state(&store, id).await, JobState::Queued, "snooze: state");
    assert!(
        dequeue(&*store, &no_conditions::<H::Store>(), 1)
            .await
            .is_empty(),
        "snooze: claimed before its delay"
    );
    tokio::time::sleep(delay + std::time::Duration::from_millis(200)).await;
    let mut again = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("snooze: claimable after its delay");
    // One retry is allowed: had the snooze counted a failure, this error would be final.
    assert_eq!(
        store.mark_errored(&mut again, "x", None).await.unwrap(),
        Some(JobState::Errored)
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Errored,
        "snooze: must not count as a failure"
    );
}
