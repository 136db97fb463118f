//! The `Handler` trait: the hooks the worker calls around each job.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::error::BoxError;
use crate::execution_log::ExecutionLogEntry;
use crate::outcome::{HandlerError, Outcome};
use crate::retry::Retry;
use crate::store::{Lease, Store};

/// Processes jobs from a store `S`. Only [`Handler::handle`] is required.
///
/// The hooks in call order: `pre_dequeue` (before each dequeue), `pre_handle`
/// (after a job was dequeued), `handle`, then the worker records the outcome in
/// the store, then `post_handle`. A panic in any hook is caught: a panic in
/// `pre_handle` or `handle` marks the job errored with the panic message; a panic
/// in `pre_dequeue` or `post_handle` is logged and the worker goes on.
///
/// Implement the hooks with `async fn`: the trait declares them as returning
/// `impl Future + Send`, so the worker can run each job on its own task.
pub trait Handler<S: Store>: Send + Sync + 'static {
    /// Called before each dequeue. Return `Ok(None)` to skip this round (the
    /// worker waits one poll interval), or `Ok(Some(conditions))` to dequeue only
    /// jobs that also match `conditions`; this is how a budget-aware worker skips
    /// jobs larger than its remaining headroom. An error is logged and the worker
    /// waits one interval.
    fn pre_dequeue(&self) -> impl Future<Output = Result<Option<S::Conditions>, BoxError>> + Send {
        async { Ok(Some(S::Conditions::default())) }
    }

    /// Called for each dequeued job before it is handled, e.g. to take its share
    /// of a budget.
    ///
    /// This hook runs on the dequeue loop: while it runs, nothing else is
    /// dequeued. Keep it short.
    fn pre_handle(&self, record: &S::Record) -> impl Future<Output = ()> + Send {
        let _ = record;
        async {}
    }

    /// Processes the job. With the Postgres store, `job` gives access to the
    /// transaction that locks the record: writes made there commit atomically
    /// with the job's final state.
    ///
    /// The future is dropped (at its next `.await`) when the job times out, is
    /// canceled, is lost, or the worker stops immediately; `ctx.cancellation()`
    /// lets blocking or spawned work notice that too.
    fn handle(
        &self,
        job: &mut S::Job,
        ctx: &JobContext<S>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Called after the job's outcome was recorded, e.g. to give back its share
    /// of a budget. Called for every job that reached `pre_handle`.
    fn post_handle(
        &self,
        record: &S::Record,
        outcome: &Outcome,
    ) -> impl Future<Output = ()> + Send {
        let _ = (record, outcome);
        async {}
    }

    /// How long this job may run, overriding `WorkerOptions::max_runtime_per_job`
    /// when `Some` (a [`KindRegistry`](crate::KindRegistry) answers with its
    /// kind's). Default `None`: the worker's; `Some(Duration::MAX)`: no limit
    /// at all. `Some(Duration::ZERO)` would time the job out at once: the
    /// worker logs a warning and uses its own.
    fn max_runtime(&self, _record: &S::Record) -> Option<std::time::Duration> {
        None
    }

    /// How this job is retried when it errors, overriding the store's retry
    /// policy when `Some` (a [`KindRegistry`](crate::KindRegistry) answers with
    /// its kind's): the worker hands it to [`Store::mark_errored`]. A job's own
    /// retry limit (a `max_retries` column) still wins. Default `None`: the
    /// store's. A delay that fails [`RetryPolicy::check`](crate::RetryPolicy::check)
    /// is not used: the worker logs a warning and the store's delay applies.
    fn retry(&self, _record: &S::Record) -> Option<Retry> {
        None
    }

    /// The kind of job `record` is, for the metrics by kind
    /// ([`JOBS_BY_KIND_TOTAL`](crate::metrics::JOBS_BY_KIND_TOTAL)): a
    /// [`KindRegistry`](crate::KindRegistry) answers with the record's kind.
    /// Default `None`: not counted by kind.
    fn kind<'a>(&'a self, _record: &'a S::Record) -> Option<&'a str> {
        None
    }
}

/// What a running handler can reach besides its job.
pub struct JobContext<S: Store> {
    pub(crate) store: Arc<S>,
    pub(crate) lease: Lease,
    pub(crate) cancel: CancellationToken,
    pub(crate) worker_name: Arc<str>,
}

impl<S: Store> std::fmt::Debug for JobContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("lease", &self.lease)
            .field("worker_name", &self.worker_name)
            .field("canceled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<S: Store> JobContext<S> {
    /// The store the job came from.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// This attempt's lease on the record.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// The name of the worker running the job.
    pub fn worker_name(&self) -> &str {
        &self.worker_name
    }

    /// Fired when the job times out, is canceled or lost, or the worker stops.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Appends an entry to the job's execution log; returns its index, or `None`
    /// if this attempt no longer owns the record. An attempt may append at most
    /// [`MAX_EXECUTION_LOG_ENTRIES`](crate::MAX_EXECUTION_LOG_ENTRIES) entries; the
    /// next append fails with [`Error::ExecutionLogFull`](crate::Error::ExecutionLogFull).
    pub async fn log(&self, entry: &ExecutionLogEntry) -> Result<Option<usize>, BoxError> {
        self.store.add_execution_log_entry(self.lease, entry).await
    }

    /// Replaces the log entry at `index`; returns whether the update took effect.
    pub async fn update_log(
        &self,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> Result<bool, BoxError> {
        self.store
            .update_execution_log_entry(self.lease, index, entry)
            .await
    }
}

/// A shared handler is a handler: keep an `Arc` to read its state (counters, a
/// budget) while the worker runs it.
impl<S: Store, H: Handler<S>> Handler<S> for Arc<H> {
    async fn pre_dequeue(&self) -> Result<Option<S::Conditions>, BoxError> {
        (**self).pre_dequeue().await
    }

    async fn pre_handle(&self, record: &S::Record) {
        (**self).pre_handle(record).await
    }

    async fn handle(&self, job: &mut S::Job, ctx: &JobContext<S>) -> Result<(), HandlerError> {
        (**self).handle(job, ctx).await
    }

    async fn post_handle(&self, record: &S::Record, outcome: &Outcome) {
        (**self).post_handle(record, outcome).await
    }

    fn max_runtime(&self, record: &S::Record) -> Option<std::time::Duration> {
        (**self).max_runtime(record)
    }

    fn kind<'a>(&'a self, record: &'a S::Record) -> Option<&'a str> {
        (**self).kind(record)
    }

    fn retry(&self, record: &S::Record) -> Option<Retry> {
        (**self).retry(record)
    }
}
