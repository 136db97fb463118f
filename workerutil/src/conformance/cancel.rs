//! The handler-cancel case of the conformance suite.

use super::{Harness, dequeue, no_conditions};
use crate::state::JobState;
use crate::store::Store;

/// A job its handler canceled is `canceled` with the reason, never claimed
/// again; a stale lease (the job reset and claimed again) cancels nothing.
pub async fn handler_cancel_is_final<H: Harness>(h: &H) {
    let store = h.new_store(3).await;
    let ids = h.enqueue(&store, 2).await;
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    assert!(
        store
            .mark_canceled(&mut job, "order withdrawn")
            .await
            .unwrap(),
        "cancel: mark"
    );
    assert_eq!(
        h.state(&store, ids[0]).await,
        JobState::Canceled,
        "cancel: state"
    );
    assert_eq!(
        h.failure_message(&store, ids[0]).await.as_deref(),
        Some("order withdrawn"),
        "cancel: the reason is kept"
    );
    // Only the other job is claimable: a canceled job never runs again.
    let mut other = dequeue(&*store, &no_conditions::<H::Store>(), 2).await;
    assert_eq!(other.len(), 1, "cancel: claimed again");
    // Fenced: once the job was reset and claimed again, the old lease
    // cancels nothing.
    let mut stale = other.pop().expect("the other job");
    h.reset(&store, ids[1]).await;
    let mut fresh = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("the reset job");
    assert!(
        !store.mark_canceled(&mut stale, "late").await.unwrap(),
        "cancel: a stale lease must not write"
    );
    assert!(store.mark_complete(&mut fresh).await.unwrap());
    assert_eq!(h.state(&store, ids[1]).await, JobState::Completed);
}
