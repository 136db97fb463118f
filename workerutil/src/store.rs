//! The `Store` trait: where jobs live and how their state changes.

use std::future::Future;
use std::time::Duration;

use crate::error::BoxError;
use crate::execution_log::ExecutionLogEntry;
use crate::options::WorkerOptions;
use crate::retry::Retry;
use crate::state::JobState;
use crate::wakeup::Wakeups;

/// The primary key of a job record.
pub type RecordId = i64;

/// A job record as the store hands it to the handler.
pub trait Record: Send + Sync + 'static {
    /// The record's primary key.
    fn id(&self) -> RecordId;
}

/// Proof that this worker owns a claimed record: its id and the fencing token of
/// the claim. Every write after the claim carries the lease, and the store refuses
/// it when the record was reset and claimed again since (the token changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The record's id.
    pub id: RecordId,
    /// The fencing token the claim produced.
    pub token: i64,
}

/// A dequeued job: the record plus whatever the store needs to finish it
/// (for the Postgres store, the transaction that locks the row).
pub trait Job: Send + 'static {
    /// The record type.
    type Record: Record;
    /// The record that was dequeued.
    fn record(&self) -> &Self::Record;
    /// The lease of this claim.
    fn lease(&self) -> Lease;
    /// Told this attempt's `job` span as soon as it is made, before it is
    /// entered: a store that keeps the job's trace context ties the span to
    /// it (dbworker's traces: a child of the enqueue, or a root linked to it
    /// and to the previous attempt). Default: nothing.
    fn trace_attempt(&mut self, span: &tracing::Span) {
        let _ = span;
    }
    /// Told, before the outcome is recorded, that the handler did not return:
    /// its future was dropped (its timeout, a cancellation, a shutdown) or it
    /// panicked. Whatever it had in flight on a resource the job holds may
    /// still be running there (dbworker: a query on the job's transaction,
    /// which the store then ends instead of waiting for it). Default: nothing.
    fn abandon(&mut self) {}
}

/// What a heartbeat learned about the running jobs it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatResult {
    /// Ids the store still knows as processing under the given lease. Any other
    /// id was lost (reset, finished elsewhere, deleted) and its handler is canceled.
    pub known: Vec<RecordId>,
    /// Ids someone asked to cancel; their handlers are canceled.
    pub cancel: Vec<RecordId>,
}

/// Where jobs are persisted. The worker dequeues through it, heartbeats the
/// running jobs, and records every outcome.
///
/// Every method after `dequeue` is fenced: it takes effect only while the lease
/// (or the job's lease) still owns the record, and reports `false` (or `None`)
/// otherwise instead of overwriting someone else's claim.
///
/// Implement the methods with `async fn`; the trait declares them as
/// returning `impl Future + Send`.
pub trait Store: Send + Sync + 'static {
    /// The record type handed to the handler.
    type Record: Record;
    /// A dequeued job.
    type Job: Job<Record = Self::Record>;
    /// Extra dequeue conditions returned by `Handler::pre_dequeue`; the default
    /// value means "no extra condition".
    type Conditions: Default + Send + Sync + 'static;

    /// Checks that a worker driven with `options`, claiming up to `claim_ahead`
    /// jobs beyond its free handlers, fits this store (connection budget, heartbeat
    /// timing against the store's stalled age, ...). [`Worker::new`](crate::Worker::new)
    /// calls it, so no worker can skip the store's constraints. Default: none.
    fn check_worker_options(
        &self,
        options: &WorkerOptions,
        claim_ahead: usize,
    ) -> Result<(), BoxError> {
        let _ = (options, claim_ahead);
        Ok(())
    }

    /// How many jobs beyond its free handler slots a worker claims ahead when
    /// `WorkerOptions::claim_ahead` is `None`. Default: `num_handlers`. A store
    /// whose claimed jobs hold resources (a connection each) should answer 0.
    fn default_claim_ahead(&self, num_handlers: usize) -> usize {
        num_handlers
    }

    /// How many dequeue calls a worker keeps in flight at once while the queue
    /// is busy, when `WorkerOptions::concurrent_dequeues` is `None`. Default 2.
    fn default_concurrent_dequeues(&self) -> usize {
        2
    }

    /// Whether a dequeued job holds a store resource (a transaction, a
    /// connection) until its outcome is recorded. If not (the default), the
    /// worker gives the job's handler slot to the next job as soon as the
    /// handler returns, and records the outcome meanwhile (a store that groups
    /// its marks then never holds a handler idle).
    fn job_holds_resources(&self) -> bool {
        false
    }

    /// Wake-ups for idle dequeue loops, when the store has a notification source
    /// (a `LISTEN` connection). `None` (the default): workers only poll.
    fn wakeups(&self) -> Option<Wakeups> {
        None
    }

    /// How many jobs are waiting: queued, or errored and waiting for a retry
    /// (whether or not the retry is due yet).
    fn queued_count(&self) -> impl Future<Output = Result<u64, BoxError>> + Send;

    /// Claims up to `limit` eligible jobs (in the store's priority order) for the
    /// worker on `hostname`, restricted by `conditions`. Returns fewer, or none,
    /// when fewer are eligible. `limit` is at least 1.
    fn dequeue(
        &self,
        hostname: &str,
        conditions: &Self::Conditions,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Self::Job>, BoxError>> + Send;

    /// Phase two of a dequeue, run in the job's own task right before `handle`:
    /// acquire what the job holds while it runs (for the Postgres store in
    /// transactional handling, a transaction that locks the row). Done here
    /// rather than in `dequeue`, the next claim never waits for it, and a job
    /// waiting in the claim-ahead buffer holds nothing.
    ///
    /// Returns `false` when the store knows the job must not run: the lease no
    /// longer owns it, or the store has already recorded why it cannot run. The
    /// worker then records nothing for it. [`Error::Withheld`](crate::Error::Withheld):
    /// the store put the job back in the queue itself, and the worker reports
    /// [`Outcome::Withheld`](crate::Outcome::Withheld). Any other error
    /// leaves the outcome to the worker, which hands the job back with
    /// [`requeue`](Self::requeue). Default: `true` with no work (heartbeats and fenced marks still guard a
    /// job lost in between).
    fn open(&self, job: &mut Self::Job) -> impl Future<Output = Result<bool, BoxError>> + Send {
        let _ = job;
        async { Ok(true) }
    }

    /// Records that the given leases are alive and reports which are still known
    /// and which were asked to cancel.
    fn heartbeat(
        &self,
        leases: &[Lease],
    ) -> impl Future<Output = Result<HeartbeatResult, BoxError>> + Send;

    /// Appends an entry to the job's execution log and returns its index, or `None`
    /// when the lease no longer owns the record. Refuses with
    /// [`Error::ExecutionLogFull`](crate::Error::ExecutionLogFull) once this
    /// attempt's log holds [`MAX_EXECUTION_LOG_ENTRIES`](crate::MAX_EXECUTION_LOG_ENTRIES).
    fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> impl Future<Output = Result<Option<usize>, BoxError>> + Send;

    /// Replaces the entry at `index` (as returned by `add_execution_log_entry`).
    /// Returns whether the update took effect.
    fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Marks the job completed (committing the handler's transaction, if any).
    ///
    /// Marks take the job by `&mut` so the record stays readable for
    /// `post_handle`; a store may consume resources held in it (a transaction).
    /// A commit that fails for a reason of the job's own is answered with
    /// [`Error::CompletionFailed`](crate::Error::CompletionFailed): the
    /// worker then marks the job errored with it (a caller other than the
    /// worker must do the same, or leave the job to the resetter). One that
    /// fails for a reason not its own, after which the store put the job
    /// back, is answered with
    /// [`Error::CompletionNotWritten`](crate::Error::CompletionNotWritten). The
    /// worker finds either anywhere in the error's chain of sources.
    fn mark_complete(
        &self,
        job: &mut Self::Job,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Records a retryable failure: the store makes it `errored` (to be retried)
    /// or `failed` when retries are exhausted, or `canceled` if cancellation was
    /// requested. Any handler transaction is rolled back first. Returns the
    /// state written (`None`: this attempt no longer owns the job), so the
    /// worker tells a retry from a final failure (its `retry` and `failed`
    /// outcome labels).
    ///
    /// `retry` is the handler's override of the store's retry policy for this
    /// job ([`Handler::retry`](crate::Handler::retry)): each part it sets
    /// replaces the store's, and a job's own retry limit, where the store has
    /// one, wins over both.
    fn mark_errored(
        &self,
        job: &mut Self::Job,
        message: &str,
        retry: Option<&Retry>,
    ) -> impl Future<Output = Result<Option<JobState>, BoxError>> + Send;

    /// Records a final failure: `failed`, or `canceled` if cancellation was
    /// requested. Any handler transaction is rolled back first.
    fn mark_failed(
        &self,
        job: &mut Self::Job,
        message: &str,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Cancels the job for good at its handler's request
    /// ([`HandlerError::cancel`](crate::HandlerError::cancel)): `canceled`,
    /// with `message`. Any handler transaction is rolled back first. Default:
    /// [`mark_failed`](Self::mark_failed), for a store without a canceled
    /// state.
    fn mark_canceled(
        &self,
        job: &mut Self::Job,
        message: &str,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send {
        self.mark_failed(job, message)
    }

    /// Puts the job back in the queue without counting a failure (used when a
    /// shutdown interrupts it). Any handler transaction is rolled back first.
    fn requeue(&self, job: &mut Self::Job) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Puts a job its handler snoozed back in the queue, to be claimed no
    /// sooner than `delay` from now (the store's clock), without counting a
    /// failure or a retry. Fenced like every mark: `Ok(false)` when this
    /// attempt no longer owns the job.
    fn mark_snoozed(
        &self,
        job: &mut Self::Job,
        delay: Duration,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Ends a job's attempt waiting for the signal `signal`, at most
    /// `timeout` ([`HandlerError::wait_for`](crate::HandlerError::wait_for)):
    /// the job runs again when the signal arrives (at once if it already
    /// did) or when the timeout is up. Fenced like every mark. Like
    /// [`mark_complete`](Self::mark_complete) it may answer
    /// [`Error::CompletionFailed`](crate::Error::CompletionFailed) or
    /// [`Error::CompletionNotWritten`](crate::Error::CompletionNotWritten). By
    /// default a store without signals snoozes the job for `timeout`.
    fn mark_waiting(
        &self,
        job: &mut Self::Job,
        signal: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send {
        let _ = signal;
        self.mark_snoozed(job, timeout)
    }
}

/// How many jobs a worker with `options` claims ahead over `store` at first:
/// `claim_ahead` when set (and always), else 0 with a capped
/// `max_per_dequeue`, else what the store suggests
/// ([`Store::default_claim_ahead`]), where the adaptive allowance starts.
pub fn claim_ahead<S: Store + ?Sized>(options: &WorkerOptions, store: &S) -> usize {
    options.claim_ahead.unwrap_or_else(|| {
        if options.max_per_dequeue.is_some() {
            0
        } else {
            store.default_claim_ahead(options.num_handlers)
        }
    })
}

/// How many dequeue calls a worker with `options` keeps in flight over
/// `store`: `concurrent_dequeues` when set, else 1 with a capped
/// `max_per_dequeue`, else what the store suggests
/// ([`Store::default_concurrent_dequeues`]).
pub fn concurrent_dequeues<S: Store + ?Sized>(options: &WorkerOptions, store: &S) -> usize {
    options.concurrent_dequeues.unwrap_or_else(|| {
        if options.max_per_dequeue.is_some() {
            1
        } else {
            store.default_concurrent_dequeues()
        }
    })
}
