//! A job's task, from `pre_handle` to `post_handle`: run the handler under
//! its timeout and cancel token, map what happened to an [`Outcome`], record
//! it in the store. The dequeue loop (`worker`) starts one per claimed job.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backoff::sleep_until_opt;
use crate::error::{BoxError, Error, error_chain};
use crate::events::{Hook, WorkerEvent};
use crate::handler::{Handler, JobContext};
use crate::metrics;
use crate::outcome::{Outcome, SharedError};
use crate::panics::{caught, guarded, panic_message};
use crate::retry::Retry;
use crate::running::{CancelReason, Claimed, Running, Shared};
use crate::state::JobState;
use crate::store::{Job, Lease, Store};

/// Runs `pre_handle` on the loop, then spawns the job's task, which owns `permit`.
pub(crate) async fn start_job<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S>>,
    handler: &Arc<H>,
    tracker: &TaskTracker,
    claimed: Claimed<S::Job>,
    permit: OwnedSemaphorePermit,
) {
    let shared = shared.clone();
    let handler = handler.clone();
    let Claimed { mut job, running } = claimed;
    let lease = running.lease;
    // A root span per job (one trace per job in OpenTelemetry, not one
    // trace for the worker's whole life), linked to the worker's span.
    // `otel.*` fields become the span's status under tracing-opentelemetry.
    let span = tracing::info_span!(
        parent: None,
        "job",
        worker = %shared.name,
        record_id = lease.id,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
    );
    span.follows_from(tracing::Span::current());
    job.trace_attempt(&span);
    shared.emit(WorkerEvent::Dequeued { id: lease.id });

    let pre_handle = AssertUnwindSafe(handler.pre_handle(job.record()))
        .catch_unwind()
        .instrument(span.clone())
        .await;
    let pre_panic = pre_handle.err().map(|panic| {
        let message = panic_message(&panic);
        tracing::error!(parent: &span, panic = %message, "pre_handle panicked");
        shared.emit(WorkerEvent::HookPanicked {
            hook: Hook::PreHandle,
            id: Some(lease.id),
            message: message.clone(),
        });
        message
    });

    tracker.spawn(
        async move {
            // The task owns its slot: it frees on every path, panics included.
            let slot = Slot {
                permit: Some(permit),
                freed: shared.slot_freed.clone(),
            };
            // Heartbeated until the outcome is written; leaves the set on
            // every path, panics included.
            let listed = Listed {
                shared: shared.clone(),
                lease,
            };
            let started = Instant::now();
            let mut job = job;
            let outcome = match pre_panic {
                Some(message) => Outcome::Panicked(message),
                // Boxed: the handler's future is freed when it ends, so a job
                // waiting for its outcome to be written holds only what
                // follows (measured: 9.3 KB per waiting job inline).
                None => Box::pin(execute(&shared, &*handler, &mut job, &running)).await,
            };
            // The lease stays heartbeated while the outcome waits to be
            // written: a mark slower than the store's stalled age must not
            // have the resetter requeue a finished job.
            shared.running.recording(lease);
            metrics::running(&shared.name, shared.running.len());
            // The handler is done: unless the job holds a store resource until
            // its mark, its slot goes to the next job while the outcome is
            // written (a bounded number of outcomes wait at once).
            let (_slot, _recording) = if shared.store.job_holds_resources() {
                (Some(slot), None)
            } else {
                let recording = shared.recording.clone().acquire_owned().await;
                drop(slot);
                (
                    None,
                    Some(recording.expect("the semaphore is never closed")),
                )
            };
            let retry = retry_of(&*handler, job.record(), &outcome);
            let (mut marked, mut written, refused) =
                record_outcome(&shared, &mut job, &outcome, retry.as_ref()).await;
            let outcome = match refused {
                // The completion failed for a reason of the job's own (its
                // commit): recorded, reported and counted as the error it is,
                // under the job's retry policy.
                Some(Refused::Failed(cause)) => {
                    let outcome = Outcome::Errored(cause);
                    let retry = retry_of(&*handler, job.record(), &outcome);
                    (marked, written, _) =
                        record_outcome(&shared, &mut job, &outcome, retry.as_ref()).await;
                    outcome
                }
                // The store put it back: it runs again, nothing completed.
                Some(Refused::PutBack) => Outcome::Interrupted,
                // Past its reset limit: failed, with no retry left.
                Some(Refused::Ended(cause)) => Outcome::Errored(cause),
                None => outcome,
            };
            drop(listed);
            if let Some(kind) = catch_unwind_kind(&*handler, job.record()) {
                metrics::job_of_kind_finished(kind, outcome.label(marked, written));
            }
            shared
                .recorded
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Err(panic) = AssertUnwindSafe(handler.post_handle(job.record(), &outcome))
                .catch_unwind()
                .await
            {
                let message = panic_message(&panic);
                tracing::error!(panic = %message, "post_handle panicked");
                shared.emit(WorkerEvent::HookPanicked {
                    hook: Hook::PostHandle,
                    id: Some(lease.id),
                    message,
                });
            }
            let span = tracing::Span::current();
            span.record("outcome", outcome.kind());
            match outcome.failure_message() {
                Some(message) => {
                    span.record("otel.status_code", "ERROR");
                    span.record("otel.status_message", message.as_str());
                    tracing::warn!(outcome = outcome.kind(), marked, error = %message, "job did not complete");
                }
                None => tracing::debug!(outcome = outcome.kind(), marked, "job finished"),
            }
            metrics::job_finished(&shared.name, &outcome, marked, started.elapsed());
            shared.emit(WorkerEvent::JobFinished {
                id: lease.id,
                outcome,
                marked,
            });
        }
        .instrument(span),
    );
}

/// Runs `handle` until it returns, panics, times out, or its token fires.
async fn execute<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S>>,
    handler: &H,
    job: &mut S::Job,
    running: &Running,
) -> Outcome {
    // Lost or canceled while it waited in the buffer: don't start it. A job
    // that never ran is not charged a failure for expired heartbeats.
    if running.token.is_cancelled() {
        return match canceled_outcome(shared, running) {
            Outcome::HeartbeatExpired(_) => Outcome::Interrupted,
            other => other,
        };
    }
    // Phase two of the dequeue, off the dequeue loop: the next claim does not
    // wait for it. It may wait for a connection: a cancellation (a shutdown,
    // a request) meanwhile ends it as it would a buffered job's. Not a beat
    // that no longer finds the job: the open may have handed it back (a
    // pause), and says so; if the open answers "ours" all the same (an open
    // that checks nothing), the beat's miss keeps the job from starting.
    shared.running.opening(running.lease);
    let opened = tokio::select! {
        biased;
        opened = guarded("open", shared.store.open(job)) => opened,
        () = running.token.cancelled() => {
            shared.running.opened(running.lease);
            return match canceled_outcome(shared, running) {
                Outcome::HeartbeatExpired(_) => Outcome::Interrupted,
                other => other,
            };
        }
    };
    let lost_meanwhile = shared.running.opened(running.lease);
    match opened {
        Ok(true) if lost_meanwhile => {
            tracing::warn!(worker = %shared.name, record_id = running.lease.id, "a heartbeat lost the job while it was being opened; not starting it");
            return Outcome::Lost;
        }
        Ok(true) => {}
        // Someone else owns it now, or the store recorded why it cannot run.
        Ok(false) => return Outcome::Lost,
        Err(err) => {
            if let Some(Error::Withheld(reason)) = answer_in_chain(err.as_ref()) {
                return Outcome::Withheld(reason.clone());
            }
            let message = error_chain(err.as_ref());
            tracing::error!(error = %message, "opening the job failed; handing it back");
            shared.emit(WorkerEvent::StoreFailed {
                op: "open",
                message,
            });
            return Outcome::Interrupted;
        }
    }
    let ctx = JobContext {
        store: shared.store.clone(),
        lease: running.lease,
        cancel: running.token.clone(),
        worker_name: shared.name.clone(),
    };
    // Asking may panic (a kind read from a malformed row): the job fails
    // with the reason instead of unwinding past its bookkeeping, which
    // would leave it running, heartbeat and all, for the process's life.
    let asked = match caught(|| handler.max_runtime(job.record())) {
        Ok(asked) => asked,
        Err(panic) => {
            let message = format!("max_runtime panicked: {panic}");
            tracing::error!(panic = %message, "the handler's max_runtime panicked");
            return Outcome::Panicked(message);
        }
    };
    // A zero answer would time the job out at once: the worker's applies.
    let own = asked.filter(|max| {
        if max.is_zero() {
            tracing::warn!("the handler's max_runtime for this job is zero; the worker's applies");
        }
        !max.is_zero()
    });
    // `Duration::MAX` (`KindOptions::no_timeout`) opts out of the worker's
    // limit: no deadline at all.
    let max_runtime = own
        .or(shared.options.max_runtime_per_job)
        .filter(|max| *max != Duration::MAX);
    let started = Instant::now();
    // Whether the handler's future ended without returning (dropped, or
    // unwound by a panic): the job's store resources may be mid-operation.
    let mut abandoned = true;
    let outcome = tokio::select! {
        // A handler that finished wins over a cancellation that fired at the same time.
        biased;
        result = AssertUnwindSafe(handler.handle(job, &ctx)).catch_unwind() => {
            let ran = started.elapsed();
            // The timer below never got a chance: the handler did not yield.
            if max_runtime.is_some_and(|max| ran > max + OVERRUN_TOLERANCE) {
                tracing::error!(ran = ?ran, max_runtime = ?max_runtime, "handler ran past max_runtime_per_job without yielding; it blocks the thread (use tokio::task::spawn_blocking)");
                metrics::overran(&shared.name);
                shared.emit(WorkerEvent::Overran { id: running.lease.id, ran });
            }
            abandoned = result.is_err();
            match result {
                Ok(Ok(())) => Outcome::Completed,
                // A handler that gave up because its token fired (a shutdown, a
                // cancel request, a loss) is recorded for that reason, not charged
                // with its own error.
                Ok(Err(_)) if running.token.is_cancelled() => canceled_outcome(shared, running),
                Ok(Err(err)) => Outcome::from_handler_error(err),
                Err(panic) => {
                    let message = panic_message(&panic);
                    tracing::error!(panic = %message, "handle panicked");
                    shared.emit(WorkerEvent::HookPanicked { hook: Hook::Handle, id: Some(running.lease.id), message: message.clone() });
                    Outcome::Panicked(message)
                }
            }
        },
        _ = running.token.cancelled() => canceled_outcome(shared, running),
        _ = sleep_until_opt(max_runtime.and_then(|d| started.checked_add(d))) => Outcome::TimedOut(max_runtime.unwrap_or_default()),
    };
    if abandoned {
        job.abandon();
    }
    // Anything the handler spawned with the token should stop too.
    running.token.cancel();
    outcome
}

/// How much later than `max_runtime_per_job` a handler may return before it
/// counts as having overrun (timers fire on the runtime's tick, not exactly).
const OVERRUN_TOLERANCE: Duration = Duration::from_millis(10);

/// The outcome of a job whose token fired, by why it fired.
fn canceled_outcome<S>(shared: &Shared<S>, running: &Running) -> Outcome {
    match running.reason.get() {
        Some(CancelReason::Requested) => Outcome::Canceled,
        Some(CancelReason::Lost) => Outcome::Lost,
        Some(CancelReason::HeartbeatExpired) => {
            Outcome::HeartbeatExpired(shared.options.heartbeat_failure_limit.unwrap_or_default())
        }
        None => Outcome::Interrupted,
    }
}

/// The kind's (or handler's) retry policy, which goes with an errored mark;
/// if asking for it panics, the store's applies, as it does for an invalid
/// delay.
fn retry_of<S: Store, H: Handler<S>>(
    handler: &H,
    record: &S::Record,
    outcome: &Outcome,
) -> Option<Retry> {
    match outcome {
        Outcome::Completed | Outcome::Lost | Outcome::Interrupted | Outcome::Withheld(_) => None,
        _ => caught(|| handler.retry(record))
            .unwrap_or(None)
            .map(Retry::without_invalid_delay),
    }
}

/// A completion the store did not write, and what became of the job.
enum Refused {
    /// For a reason of the job's own ([`Error::CompletionFailed`]): the
    /// caller records it as an error.
    Failed(SharedError),
    /// For a reason not its own ([`Error::CompletionNotWritten`]); the
    /// store put it back in the queue (or the resetter will).
    PutBack,
    /// For a reason not its own, and the store failed it past its reset
    /// limit.
    Ended(SharedError),
}

/// Records the outcome in the store; returns whether the mark took effect,
/// for an errored mark the state the store wrote (a retry or a final
/// failure), and a completion the store refused.
async fn record_outcome<S: Store>(
    shared: &Shared<S>,
    job: &mut S::Job,
    outcome: &Outcome,
    retry: Option<&Retry>,
) -> (bool, Option<JobState>, Option<Refused>) {
    let store = &shared.store;
    let message = outcome.failure_message().unwrap_or_default();
    let mut written = None;
    let (op, result) = match outcome {
        Outcome::Completed => (
            "mark_complete",
            guarded("mark_complete", store.mark_complete(job)).await,
        ),
        Outcome::Errored(_)
        | Outcome::TimedOut(_)
        | Outcome::Panicked(_)
        | Outcome::HeartbeatExpired(_) => {
            let mark = guarded("mark_errored", store.mark_errored(job, &message, retry)).await;
            written = mark.as_ref().ok().copied().flatten();
            ("mark_errored", mark.map(|state| state.is_some()))
        }
        Outcome::Failed(_) | Outcome::Canceled => (
            "mark_failed",
            guarded("mark_failed", store.mark_failed(job, &message)).await,
        ),
        Outcome::CanceledByHandler(_) => (
            "mark_canceled",
            guarded("mark_canceled", store.mark_canceled(job, &message)).await,
        ),
        Outcome::Interrupted => ("requeue", guarded("requeue", store.requeue(job)).await),
        Outcome::Snoozed(delay) => (
            "mark_snoozed",
            guarded("mark_snoozed", store.mark_snoozed(job, *delay)).await,
        ),
        Outcome::Waiting { signal, timeout } => (
            "mark_waiting",
            guarded("mark_waiting", store.mark_waiting(job, signal, *timeout)).await,
        ),
        // Someone else owns the record now: write nothing.
        Outcome::Lost => return (false, None, None),
        // The store put it back already.
        Outcome::Withheld(_) => return (true, None, None),
    };
    let marked = match result {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(
                op,
                "the store refused the mark: this attempt no longer owns the job"
            );
            false
        }
        Err(err) => {
            // A store that wraps its errors keeps these answers: the chain
            // is searched, and the whole error is the cause.
            match answer_in_chain(err.as_ref()) {
                Some(Error::CompletionFailed(_)) => {
                    let message = error_chain(err.as_ref());
                    tracing::warn!(op, error = %message, "completing the job failed; recording it as errored");
                    let cause = match err.downcast::<Error>().map(|e| *e) {
                        Ok(Error::CompletionFailed(cause)) => cause,
                        Ok(other) => BoxError::from(other),
                        Err(err) => err,
                    };
                    return (false, None, Some(Refused::Failed(SharedError::from(cause))));
                }
                Some(Error::CompletionNotWritten { state, .. }) => {
                    let message = error_chain(err.as_ref());
                    tracing::warn!(op, error = %message, written = ?state, "the completion was not written");
                    return match state {
                        Some(JobState::Queued) => (true, None, Some(Refused::PutBack)),
                        Some(JobState::Failed) => (
                            true,
                            Some(JobState::Failed),
                            Some(Refused::Ended(SharedError::from(err))),
                        ),
                        _ => (false, None, Some(Refused::PutBack)),
                    };
                }
                _ => {}
            }
            let message = error_chain(err.as_ref());
            tracing::error!(op, error = %message, "recording the outcome failed");
            shared.emit(WorkerEvent::StoreFailed { op, message });
            false
        }
    };
    (marked, written, None)
}

/// The handler's answer to [`Handler::kind`]; a panic in it counts the job
/// under no kind.
fn catch_unwind_kind<'a, S: Store, H: Handler<S>>(
    handler: &'a H,
    record: &'a S::Record,
) -> Option<&'a str> {
    caught(|| handler.kind(record)).unwrap_or(None)
}

/// A job's handler slot. Giving it back wakes the dequeue loop, which may now
/// have room for a claim.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    freed: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit goes back first, so the woken loop sees the free slot.
        drop(self.permit.take());
        self.freed.notify_one();
    }
}

/// A job's entry in the running set: removed when this drops, once its
/// outcome is written (or the task unwound), so no lease is heartbeated on.
struct Listed<S> {
    shared: Arc<Shared<S>>,
    lease: Lease,
}

impl<S> Drop for Listed<S> {
    fn drop(&mut self) {
        self.shared.running.remove(self.lease);
        metrics::running(&self.shared.name, self.shared.running.len());
    }
}

/// The store's answer in `err`'s chain of sources, `err` included: the
/// first [`Error::CompletionFailed`], [`Error::CompletionNotWritten`] or
/// [`Error::Withheld`], however the store wrapped it (in an
/// [`Error::Store`] too).
fn answer_in_chain<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(
            found @ (Error::CompletionFailed(_)
            | Error::CompletionNotWritten { .. }
            | Error::Withheld(_)),
        ) = e.downcast_ref::<Error>()
        {
            return Some(found);
        }
        next = e.source();
    }
    None
}
