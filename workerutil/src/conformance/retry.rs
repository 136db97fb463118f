//! The conformance case of retry overrides (`Store::mark_errored`'s `retry`).

use std::time::Duration;

use super::{Harness, dequeue, ids, no_conditions};
use crate::retry::{Retry, RetryPolicy};
use crate::state::JobState;
use crate::store::{Job, RecordId, Store};

/// A retry override replaces the store's limit or delay for the job it comes
/// with; a job marked without one keeps the store's.
pub async fn retry_override<H: Harness>(h: &H) {
    // The store retries five times, at once.
    let store = h.new_store(5).await;
    let all = h.enqueue(&store, 3).await;
    let (limited, delayed, plain) = (all[0], all[1], all[2]);
    let override_for = |id| {
        if id == limited {
            Some(Retry::new().max_retries(1))
        } else if id == delayed {
            Some(Retry::new().delay(RetryPolicy::fixed(Duration::from_secs(3600))))
        } else {
            None
        }
    };
    assert_eq!(
        error_all::<H>(&store, 1, override_for).await,
        all,
        "retry_override: first attempt"
    );
    for id in &all {
        assert_eq!(
            h.state(&store, *id).await,
            JobState::Errored,
            "retry_override: state of {id} after one error"
        );
    }
    // The delayed job waits its hour; the others retry at once (the store's delay).
    assert_eq!(
        error_all::<H>(&store, 2, override_for).await,
        vec![limited, plain],
        "retry_override: second attempt (the delayed job must wait)"
    );
    assert_eq!(
        h.state(&store, limited).await,
        JobState::Failed,
        "retry_override: one retry allowed, so the second error is final"
    );
    assert_eq!(
        h.state(&store, plain).await,
        JobState::Errored,
        "retry_override: a job without an override keeps the store's five retries"
    );
    assert_eq!(
        h.state(&store, delayed).await,
        JobState::Errored,
        "retry_override: the delayed job still waits"
    );
}

/// Claims every eligible job and marks each errored with its override;
/// returns the ids claimed.
async fn error_all<H: Harness>(
    store: &H::Store,
    attempt: u32,
    override_for: impl Fn(RecordId) -> Option<Retry>,
) -> Vec<RecordId> {
    let mut jobs = dequeue(store, &no_conditions::<H::Store>(), 3).await;
    let claimed = ids(&jobs);
    for job in &mut jobs {
        let retry = override_for(job.lease().id);
        assert!(
            store
                .mark_errored(job, &format!("boom {attempt}"), retry.as_ref())
                .await
                .unwrap()
                .is_some(),
            "retry_override: mark of attempt {attempt}"
        );
    }
    claimed
}
