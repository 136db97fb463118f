//! The conformance suite every [`Store`] must pass (feature `testing`).
//!
//! A store crate implements [`Harness`] for its store and calls
//! [`run_all`] from a test. The in-memory store and the Postgres store run the
//! same cases, so a handler unit-tested against [`MemoryStore`](crate::MemoryStore)
//! sees the same semantics in production.
//!
//! Each case panics with a message naming the case and what differed.

use std::future::Future;
use std::sync::Arc;

use crate::error::Error;
use crate::execution_log::{ExecutionLogEntry, MAX_EXECUTION_LOG_ENTRIES};
use crate::state::JobState;
use crate::store::{Job, Lease, RecordId, Store};

/// What the suite needs from a store's test setup.
pub trait Harness: Send + Sync {
    /// The store under test.
    type Store: Store;

    /// A new, empty store that retries an errored job `max_num_retries` times
    /// with no retry delay and allows one reset (`max_num_resets` = 1: the first
    /// reset requeues, a second would fail the job).
    fn new_store(&self, max_num_retries: u32) -> impl Future<Output = Arc<Self::Store>> + Send;

    /// Adds `n` queued jobs; returns their ids in the order the store dequeues them.
    fn enqueue(&self, store: &Self::Store, n: usize) -> impl Future<Output = Vec<RecordId>> + Send;

    /// The job's current state.
    fn state(&self, store: &Self::Store, id: RecordId) -> impl Future<Output = JobState> + Send;

    /// The job's failure message.
    fn failure_message(
        &self,
        store: &Self::Store,
        id: RecordId,
    ) -> impl Future<Output = Option<String>> + Send;

    /// Asks for the job to be canceled.
    fn request_cancel(&self, store: &Self::Store, id: RecordId) -> impl Future<Output = ()> + Send;

    /// Does what the resetter does to a stalled processing job.
    fn reset(&self, store: &Self::Store, id: RecordId) -> impl Future<Output = ()> + Send;

    /// Conditions that match only the given ids.
    fn only(&self, ids: &[RecordId]) -> <Self::Store as Store>::Conditions;

    /// The job's execution log.
    fn execution_log(
        &self,
        store: &Self::Store,
        id: RecordId,
    ) -> impl Future<Output = Vec<ExecutionLogEntry>> + Send;
}

mod cancel;
mod retry;
mod snooze;
pub use cancel::handler_cancel_is_final;
pub use retry::retry_override;
pub use snooze::snooze_waits_without_a_failure;

const HOST: &str = "conformance-host";

pub(crate) fn no_conditions<S: Store>() -> S::Conditions {
    S::Conditions::default()
}

/// Runs every case.
pub async fn run_all<H: Harness>(h: &H) {
    dequeue_empty(h).await;
    dequeue_in_order_up_to_limit(h).await;
    complete_once(h).await;
    retries_then_failure(h).await;
    non_retryable_failure(h).await;
    heartbeat_known_and_cancel(h).await;
    cancel_marks_canceled(h).await;
    cancel_before_start(h).await;
    fencing_after_reset(h).await;
    conditions_filter(h).await;
    execution_log(h).await;
    execution_log_is_capped(h).await;
    requeue_keeps_failures(h).await;
    snooze_waits_without_a_failure(h).await;
    retry_override(h).await;
    handler_cancel_is_final(h).await;
}

pub(crate) async fn dequeue<S: Store>(
    store: &S,
    cond: &S::Conditions,
    limit: usize,
) -> Vec<S::Job> {
    store.dequeue(HOST, cond, limit).await.expect("dequeue")
}

pub(crate) fn ids<J: Job>(jobs: &[J]) -> Vec<RecordId> {
    jobs.iter().map(|j| j.lease().id).collect()
}

/// An empty store dequeues nothing and counts zero.
pub async fn dequeue_empty<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    assert_eq!(
        store.queued_count().await.unwrap(),
        0,
        "dequeue_empty: queued_count"
    );
    let jobs = dequeue(&*store, &no_conditions::<H::Store>(), 3).await;
    assert!(jobs.is_empty(), "dequeue_empty: got {:?}", ids(&jobs));
}

/// Dequeue hands out up to `limit` distinct jobs in order, marks them
/// processing, and never hands a processing job out again.
pub async fn dequeue_in_order_up_to_limit<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let all = h.enqueue(&store, 5).await;
    assert_eq!(
        store.queued_count().await.unwrap(),
        5,
        "dequeue_in_order: queued_count"
    );
    let first = dequeue(&*store, &no_conditions::<H::Store>(), 2).await;
    assert_eq!(
        ids(&first),
        all[..2].to_vec(),
        "dequeue_in_order: first batch"
    );
    for id in ids(&first) {
        assert_eq!(
            h.state(&store, id).await,
            JobState::Processing,
            "dequeue_in_order: state"
        );
    }
    assert_eq!(
        store.queued_count().await.unwrap(),
        3,
        "dequeue_in_order: queued_count after"
    );
    let rest = dequeue(&*store, &no_conditions::<H::Store>(), 10).await;
    assert_eq!(ids(&rest), all[2..].to_vec(), "dequeue_in_order: rest");
    assert!(
        dequeue(&*store, &no_conditions::<H::Store>(), 10)
            .await
            .is_empty(),
        "dequeue_in_order: drained"
    );
    for lease in first.iter().chain(&rest).map(Job::lease) {
        assert_ne!(lease.id, 0, "dequeue_in_order: id");
    }
}

/// A completed job cannot be marked again.
pub async fn complete_once<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("complete_once: a job");
    // The worker opens every job before its handler runs.
    assert!(
        store.open(&mut job).await.unwrap(),
        "complete_once: a freshly claimed job must open"
    );
    assert!(
        store.mark_complete(&mut job).await.unwrap(),
        "complete_once: first mark"
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Completed,
        "complete_once: state"
    );
    assert!(
        !store.mark_failed(&mut job, "late").await.unwrap(),
        "complete_once: second mark must be refused"
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Completed,
        "complete_once: state after refused mark"
    );
}

/// An errored job is retried `max_num_retries` times, then failed, keeping the message.
pub async fn retries_then_failure<H: Harness>(h: &H) {
    let store = h.new_store(2).await;
    let id = h.enqueue(&store, 1).await[0];
    for attempt in 1..=3 {
        let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
            .await
            .pop()
            .unwrap_or_else(|| panic!("retries: attempt {attempt} found no job"));
        let written = store
            .mark_errored(&mut job, &format!("boom {attempt}"), None)
            .await
            .unwrap();
        let expected = if attempt < 3 {
            JobState::Errored
        } else {
            JobState::Failed
        };
        // The mark says what it wrote: a retry, then the final failure.
        assert_eq!(
            written,
            Some(expected),
            "retries: the state the mark of attempt {attempt} reports"
        );
        assert_eq!(
            h.state(&store, id).await,
            expected,
            "retries: state after attempt {attempt}"
        );
        assert_eq!(
            h.failure_message(&store, id).await.as_deref(),
            Some(format!("boom {attempt}").as_str()),
            "retries: message"
        );
    }
    assert!(
        dequeue(&*store, &no_conditions::<H::Store>(), 1)
            .await
            .is_empty(),
        "retries: failed job dequeued"
    );
}

/// A non-retryable failure is final even with retries left.
pub async fn non_retryable_failure<H: Harness>(h: &H) {
    let store = h.new_store(5).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    assert!(store.mark_failed(&mut job, "poison").await.unwrap());
    assert_eq!(
        h.state(&store, id).await,
        JobState::Failed,
        "non_retryable: state"
    );
    assert_eq!(
        h.failure_message(&store, id).await.as_deref(),
        Some("poison")
    );
    assert!(
        dequeue(&*store, &no_conditions::<H::Store>(), 1)
            .await
            .is_empty(),
        "non_retryable: dequeued again"
    );
}

/// Heartbeat reports owned jobs as known, others not, and cancel requests.
pub async fn heartbeat_known_and_cancel<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let all = h.enqueue(&store, 2).await;
    let jobs = dequeue(&*store, &no_conditions::<H::Store>(), 2).await;
    let leases: Vec<Lease> = jobs.iter().map(Job::lease).collect();
    let stranger = Lease {
        id: all[1] + 1_000_000,
        token: 1,
    };
    let mut with_stranger = leases.clone();
    with_stranger.push(stranger);
    let r = store.heartbeat(&with_stranger).await.unwrap();
    let mut known = r.known.clone();
    known.sort_unstable();
    assert_eq!(known, all, "heartbeat: known");
    assert!(r.cancel.is_empty(), "heartbeat: nothing to cancel yet");
    h.request_cancel(&store, all[1]).await;
    let r = store.heartbeat(&leases).await.unwrap();
    assert_eq!(r.cancel, vec![all[1]], "heartbeat: cancel");
    // A wrong token is not known.
    let forged = Lease {
        id: all[0],
        token: leases[0].token.wrapping_add(7),
    };
    let r = store.heartbeat(&[forged]).await.unwrap();
    assert!(
        r.known.is_empty(),
        "heartbeat: a forged token must not be known"
    );
}

/// A job whose cancellation was requested ends `canceled` when marked failed.
pub async fn cancel_marks_canceled<H: Harness>(h: &H) {
    let store = h.new_store(3).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    h.request_cancel(&store, id).await;
    assert!(
        store
            .mark_failed(&mut job, "job was canceled")
            .await
            .unwrap()
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Canceled,
        "cancel: state"
    );
}

/// A job whose cancellation was requested while it waited is never handed
/// out; it ends `canceled`.
pub async fn cancel_before_start<H: Harness>(h: &H) {
    let store = h.new_store(3).await;
    let all = h.enqueue(&store, 2).await;
    h.request_cancel(&store, all[0]).await;
    let jobs = dequeue(&*store, &no_conditions::<H::Store>(), 2).await;
    assert_eq!(
        ids(&jobs),
        vec![all[1]],
        "cancel_before_start: only the other job"
    );
    assert_eq!(
        h.state(&store, all[0]).await,
        JobState::Canceled,
        "cancel_before_start: state"
    );
    assert!(
        dequeue(&*store, &no_conditions::<H::Store>(), 2)
            .await
            .is_empty()
    );
}

/// After a reset and a new claim, every write through the old lease is refused.
pub async fn fencing_after_reset<H: Harness>(h: &H) {
    let store = h.new_store(3).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut stale = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    h.reset(&store, id).await;
    assert_eq!(
        h.state(&store, id).await,
        JobState::Queued,
        "fencing: reset state"
    );
    let mut fresh = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("fencing: reclaim");
    assert_ne!(
        stale.lease(),
        fresh.lease(),
        "fencing: a new claim needs a new token"
    );
    let stale_lease = stale.lease();
    assert!(
        store
            .heartbeat(&[stale_lease])
            .await
            .unwrap()
            .known
            .is_empty(),
        "fencing: stale heartbeat known"
    );
    let entry = ExecutionLogEntry {
        key: "stale".into(),
        ..Default::default()
    };
    assert_eq!(
        store
            .add_execution_log_entry(stale_lease, &entry)
            .await
            .unwrap(),
        None,
        "fencing: stale log"
    );
    assert!(
        refused(store.mark_complete(&mut stale).await),
        "fencing: stale complete"
    );
    assert!(
        refused(
            store
                .mark_errored(&mut stale, "stale", None)
                .await
                .map(|s| s.is_some())
        ),
        "fencing: stale errored"
    );
    assert!(
        refused(store.mark_failed(&mut stale, "stale").await),
        "fencing: stale failed"
    );
    assert!(
        refused(store.requeue(&mut stale).await),
        "fencing: stale requeue"
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Processing,
        "fencing: state untouched"
    );
    assert!(
        store.mark_complete(&mut fresh).await.unwrap(),
        "fencing: owner completes"
    );
    assert_eq!(h.state(&store, id).await, JobState::Completed);
}

/// A stale write must not take effect: `Ok(false)`, or an error when the
/// attempt's own resources are gone (a transaction on a connection that died).
fn refused(result: Result<bool, crate::BoxError>) -> bool {
    !matches!(result, Ok(true))
}

/// Extra conditions restrict what is dequeued.
pub async fn conditions_filter<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let all = h.enqueue(&store, 4).await;
    let wanted = [all[1], all[3]];
    let jobs = dequeue(&*store, &h.only(&wanted), 10).await;
    assert_eq!(
        ids(&jobs),
        wanted.to_vec(),
        "conditions: only the matching jobs"
    );
    assert_eq!(h.state(&store, all[0]).await, JobState::Queued);
}

/// Log entries are appended with increasing indexes and updated in place.
pub async fn execution_log<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let id = h.enqueue(&store, 1).await[0];
    let job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    let lease = job.lease();
    let first = ExecutionLogEntry {
        key: "step.one".into(),
        command: vec!["echo".into(), "1".into()],
        ..Default::default()
    };
    let second = ExecutionLogEntry {
        key: "step.two".into(),
        ..Default::default()
    };
    let i0 = store
        .add_execution_log_entry(lease, &first)
        .await
        .unwrap()
        .expect("log: owned");
    let i1 = store
        .add_execution_log_entry(lease, &second)
        .await
        .unwrap()
        .expect("log: owned");
    assert_eq!((i0, i1), (0, 1), "log: indexes");
    let done = ExecutionLogEntry {
        exit_code: Some(0),
        out: "1\n".into(),
        duration_ms: Some(5),
        ..first.clone()
    };
    assert!(
        store
            .update_execution_log_entry(lease, i0, &done)
            .await
            .unwrap(),
        "log: update"
    );
    assert!(
        !store
            .update_execution_log_entry(lease, 9, &done)
            .await
            .unwrap(),
        "log: update of a missing index"
    );
    let log = h.execution_log(&store, id).await;
    assert_eq!(log.len(), 2, "log: length");
    assert_eq!(log[0].key, "step.one");
    assert_eq!(log[0].exit_code, Some(0));
    assert_eq!(log[0].out, "1\n");
    assert_eq!(log[1].key, "step.two");
    assert!(
        log[1].start_time.is_some(),
        "log: the store fills in start_time"
    );
}

/// An attempt appends at most `MAX_EXECUTION_LOG_ENTRIES` entries; the next
/// append is refused with `Error::ExecutionLogFull`, existing entries can still
/// be updated, and the next attempt starts with an empty log.
pub async fn execution_log_is_capped<H: Harness>(h: &H) {
    let store = h.new_store(0).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    let lease = job.lease();
    let entry = |i: usize| ExecutionLogEntry {
        key: format!("step.{i}"),
        ..Default::default()
    };
    for i in 0..MAX_EXECUTION_LOG_ENTRIES {
        let index = store
            .add_execution_log_entry(lease, &entry(i))
            .await
            .unwrap_or_else(|e| panic!("log_cap: append {i} failed: {e}"));
        assert_eq!(index, Some(i), "log_cap: index of append {i}");
    }
    let err = store
        .add_execution_log_entry(lease, &entry(MAX_EXECUTION_LOG_ENTRIES))
        .await
        .expect_err("log_cap: an append past the cap must be refused");
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::ExecutionLogFull { id: i, limit }) if *i == id && *limit == MAX_EXECUTION_LOG_ENTRIES
        ),
        "log_cap: expected ExecutionLogFull, got {err}"
    );
    let last = MAX_EXECUTION_LOG_ENTRIES - 1;
    let done = ExecutionLogEntry {
        exit_code: Some(0),
        ..entry(last)
    };
    assert!(
        store
            .update_execution_log_entry(lease, last, &done)
            .await
            .unwrap(),
        "log_cap: updates still work at the cap"
    );
    let log = h.execution_log(&store, id).await;
    assert_eq!(log.len(), MAX_EXECUTION_LOG_ENTRIES, "log_cap: length");
    assert_eq!(log[last].exit_code, Some(0), "log_cap: updated entry");
    // A new attempt gets a new, empty log.
    assert!(store.requeue(&mut job).await.unwrap(), "log_cap: requeue");
    let again = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("log_cap: reclaim");
    assert_eq!(
        store
            .add_execution_log_entry(again.lease(), &entry(0))
            .await
            .unwrap(),
        Some(0),
        "log_cap: a new attempt starts over"
    );
}

/// Requeue puts a job back without counting a failure.
pub async fn requeue_keeps_failures<H: Harness>(h: &H) {
    let store = h.new_store(1).await;
    let id = h.enqueue(&store, 1).await[0];
    let mut job = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("a job");
    assert!(store.requeue(&mut job).await.unwrap(), "requeue: mark");
    assert_eq!(
        h.state(&store, id).await,
        JobState::Queued,
        "requeue: state"
    );
    // One retry is allowed: had the requeue counted a failure, this error would be final.
    let mut again = dequeue(&*store, &no_conditions::<H::Store>(), 1)
        .await
        .pop()
        .expect("requeue: claimable again");
    assert_eq!(
        store.mark_errored(&mut again, "x", None).await.unwrap(),
        Some(JobState::Errored)
    );
    assert_eq!(
        h.state(&store, id).await,
        JobState::Errored,
        "requeue: must not count as a failure"
    );
}
