//! Counters, gauges and histograms through the `metrics` facade. Nothing is
//! recorded unless the application installs a recorder (e.g. a Prometheus
//! exporter). Every series carries the worker's name.

use std::time::Duration;

use crate::events::Hook;
use crate::outcome::Outcome;

/// Jobs finished, by outcome kind (`completed`, `errored`, `failed`, …).
pub const JOBS_TOTAL: &str = "workerutil_jobs_total";
/// How long jobs ran, from the handler's start to the recorded outcome.
pub const JOB_DURATION_SECONDS: &str = "workerutil_job_duration_seconds";
/// Final marks the store refused (the attempt no longer owned the job).
pub const MARKS_REFUSED_TOTAL: &str = "workerutil_marks_refused_total";
/// Jobs running right now.
pub const RUNNING_JOBS: &str = "workerutil_running_jobs";
/// Failed store calls, by operation (`dequeue`, `heartbeat`, `mark_complete`, …).
pub const STORE_ERRORS_TOTAL: &str = "workerutil_store_errors_total";
/// Handlers that ran past `max_runtime_per_job` without yielding (blocking the thread).
pub const JOBS_OVERRAN_TOTAL: &str = "workerutil_jobs_overran_total";
/// Jobs finished, by kind and outcome (jobs whose handler names their kind,
/// as a [`KindRegistry`](crate::KindRegistry) does). The outcome tells a
/// retry from a final failure: `ok`, `retry` (errored, to run again),
/// `failed` (errored with its retries used up), `poison` (a non-retryable
/// error, failed at once), `canceled`, `snoozed`, `interrupted`, `lost`
/// (the attempt no longer owned the job).
pub const JOBS_BY_KIND_TOTAL: &str = "workerutil_jobs_by_kind_total";
/// How long handlers of each kind ran, by kind (jobs dispatched by a
/// [`KindRegistry`](crate::KindRegistry); measured around the kind's handler).
pub const JOB_DURATION_BY_KIND_SECONDS: &str = "workerutil_job_duration_by_kind_seconds";
/// Jobs of each kind in their handler right now, by kind.
pub const IN_FLIGHT_BY_KIND: &str = "workerutil_in_flight_by_kind";
/// Panics caught in hooks, by hook.
pub const HOOK_PANICS_TOTAL: &str = "workerutil_hook_panics_total";

pub(crate) fn job_finished(worker: &str, outcome: &Outcome, marked: bool, ran: Duration) {
    let labels = [
        ("worker", worker.to_owned()),
        ("outcome", outcome.kind().to_owned()),
    ];
    metrics::counter!(JOBS_TOTAL, &labels).increment(1);
    metrics::histogram!(JOB_DURATION_SECONDS, &labels).record(ran.as_secs_f64());
    if !marked && !matches!(outcome, Outcome::Lost) {
        metrics::counter!(MARKS_REFUSED_TOTAL, "worker" => worker.to_owned()).increment(1);
    }
}

/// `outcome`: the label of [`Outcome::label`] (`ok`, `retry`, `failed`,
/// `poison`, `canceled`, `snoozed`, `waiting`, `interrupted`, `withheld`,
/// `lost`).
pub(crate) fn job_of_kind_finished(kind: &str, outcome: &'static str) {
    metrics::counter!(
        JOBS_BY_KIND_TOTAL,
        "kind" => kind.to_owned(),
        "outcome" => outcome
    )
    .increment(1);
}

/// Counts a job of `kind` in flight until dropped (so a panic or a canceled
/// handler is counted out too), then records how long it was in.
pub(crate) struct KindInFlight {
    kind: String,
    since: tokio::time::Instant,
}

impl KindInFlight {
    pub(crate) fn enter(kind: &str) -> KindInFlight {
        metrics::gauge!(IN_FLIGHT_BY_KIND, "kind" => kind.to_owned()).increment(1.0);
        KindInFlight {
            kind: kind.to_owned(),
            since: tokio::time::Instant::now(),
        }
    }
}

impl Drop for KindInFlight {
    fn drop(&mut self) {
        let kind = std::mem::take(&mut self.kind);
        metrics::histogram!(JOB_DURATION_BY_KIND_SECONDS, "kind" => kind.clone())
            .record(self.since.elapsed().as_secs_f64());
        metrics::gauge!(IN_FLIGHT_BY_KIND, "kind" => kind).decrement(1.0);
    }
}

pub(crate) fn running(worker: &str, n: usize) {
    metrics::gauge!(RUNNING_JOBS, "worker" => worker.to_owned()).set(n as f64);
}

pub(crate) fn overran(worker: &str) {
    metrics::counter!(JOBS_OVERRAN_TOTAL, "worker" => worker.to_owned()).increment(1);
}

pub(crate) fn store_error(worker: &str, op: &'static str) {
    metrics::counter!(STORE_ERRORS_TOTAL, "worker" => worker.to_owned(), "op" => op).increment(1);
}

pub(crate) fn hook_panic(worker: &str, hook: Hook) {
    let hook = match hook {
        Hook::PreDequeue => "pre_dequeue",
        Hook::PreHandle => "pre_handle",
        Hook::Handle => "handle",
        Hook::PostHandle => "post_handle",
    };
    metrics::counter!(HOOK_PANICS_TOTAL, "worker" => worker.to_owned(), "hook" => hook)
        .increment(1);
}
