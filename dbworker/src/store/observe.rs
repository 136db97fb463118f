//! Every store operation counted and timed: `dbworker_store_operations_total`
//! by outcome and `dbworker_store_operation_seconds` (see `crate::metrics`).

use std::time::Instant;

use workerutil::{BoxError, JobState, Record};

use super::DbStore;
use crate::metrics::{CLAIMED_TOTAL, STORE_OPERATION_SECONDS, STORE_OPERATIONS_TOTAL};

/// What a store operation's answer says about how it went.
pub(super) trait Outcome {
    /// The `outcome` label.
    fn label(&self) -> &'static str;
}

impl Outcome for bool {
    /// `false`: the claim was no longer ours.
    fn label(&self) -> &'static str {
        if *self { "ok" } else { "lost" }
    }
}

impl Outcome for Option<JobState> {
    /// An errored mark: retried, out of retries, or not ours.
    fn label(&self) -> &'static str {
        match self {
            Some(JobState::Errored) => "retry",
            Some(JobState::Failed) => "failed",
            Some(_) => "ok",
            None => "lost",
        }
    }
}

impl<R: Record> DbStore<R> {
    /// Counts and times one operation that began at `started`.
    pub(super) fn observe<T: Outcome>(
        &self,
        op: &'static str,
        started: Instant,
        result: Result<T, BoxError>,
    ) -> Result<T, BoxError> {
        let outcome = match &result {
            Ok(answer) => answer.label(),
            Err(e) => match e.downcast_ref() {
                Some(workerutil::Error::Withheld(_)) => "withheld",
                // The completion's own failure, marked errored next.
                Some(workerutil::Error::CompletionFailed(_)) => "refused",
                Some(workerutil::Error::CompletionNotWritten { .. }) => "requeued",
                _ => "error",
            },
        };
        self.record(op, started, outcome);
        result
    }

    /// Counts and times a dequeue, and the jobs it claimed.
    pub(super) fn observe_dequeue<J>(
        &self,
        started: Instant,
        result: Result<Vec<J>, BoxError>,
    ) -> Result<Vec<J>, BoxError> {
        let outcome = match &result {
            Ok(jobs) if jobs.is_empty() => "empty",
            Ok(jobs) => {
                metrics::counter!(CLAIMED_TOTAL, "store" => self.options.label.clone())
                    .increment(jobs.len() as u64);
                "ok"
            }
            Err(_) => "error",
        };
        self.record("dequeue", started, outcome);
        result
    }

    fn record(&self, op: &'static str, started: Instant, outcome: &'static str) {
        let store = &self.options.label;
        metrics::counter!(STORE_OPERATIONS_TOTAL, "store" => store.clone(), "op" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!(STORE_OPERATION_SECONDS, "store" => store.clone(), "op" => op)
            .record(started.elapsed().as_secs_f64());
    }
}
