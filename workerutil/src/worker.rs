//! `Worker<S, H>`: the dequeue loop. Read this file first.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::error::{BoxError, Error, error_chain};
use crate::events::{Hook, WorkerEvent};
use crate::handler::{Handler, JobContext};
use crate::heartbeat::{CancelReason, Running, RunningSet, heartbeat_loop};
use crate::metrics;
use crate::options::WorkerOptions;
use crate::outcome::Outcome;
use crate::shutdown::ShutdownHandle;
use crate::store::{Job, Store};
use crate::wakeup::Wakeups;

/// State shared by the dequeue loop, the job tasks and the heartbeat loop.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) name: Arc<str>,
    pub(crate) hostname: String,
    pub(crate) options: WorkerOptions,
    pub(crate) store: Arc<S>,
    pub(crate) running: RunningSet,
    /// Jobs claimed beyond the free handler slots (resolved from the options).
    pub(crate) claim_ahead: usize,
    /// Dequeue calls in flight at once while the queue is busy (resolved).
    pub(crate) concurrent_dequeues: usize,
    /// Bounds the finished jobs whose outcome is still being written (four
    /// times the jobs a worker may hold), so slow marks slow the worker down
    /// instead of piling up.
    recording: Arc<Semaphore>,
    /// Signaled whenever a job gives its handler slot back ([`Slot`]).
    slot_freed: Arc<Notify>,
    events: broadcast::Sender<WorkerEvent>,
}

impl<S> Shared<S> {
    pub(crate) fn emit(&self, event: WorkerEvent) {
        match &event {
            WorkerEvent::StoreFailed { op, .. } => metrics::store_error(&self.name, op),
            WorkerEvent::HookPanicked { hook, .. } => metrics::hook_panic(&self.name, *hook),
            _ => {}
        }
        // No subscriber is fine: events are for whoever listens.
        let _ = self.events.send(event);
    }
}

/// Why the dequeue loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// `num_total_jobs` jobs were dequeued.
    TotalJobsReached,
    /// `max_active_time` elapsed.
    MaxActiveTimeReached,
    /// A graceful shutdown was requested.
    Graceful,
    /// An immediate shutdown was requested.
    Immediate,
}

/// What a finished [`Worker::run`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerSummary {
    /// Why it stopped.
    pub reason: StopReason,
    /// How many jobs it dequeued.
    pub dequeued: u64,
}

/// A generic worker: dequeues jobs from a [`Store`] and runs them through a
/// [`Handler`], at most `num_handlers` at a time, heartbeating the running ones.
///
/// ```
/// use std::sync::Arc;
/// use workerutil::{async_trait, Handler, HandlerError, JobContext, MemoryStore, Record, Worker, WorkerOptions};
///
/// #[derive(Clone, Debug)]
/// struct Email { id: i64, to: String }
/// impl Record for Email { fn id(&self) -> i64 { self.id } }
///
/// struct Send;
/// #[async_trait]
/// impl Handler<MemoryStore<Email>> for Send {
///     async fn handle(&self, job: &mut workerutil::MemoryJob<Email>, _ctx: &JobContext<MemoryStore<Email>>) -> Result<(), HandlerError> {
///         println!("sending to {}", job.record.to);
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), workerutil::Error> {
/// let store = Arc::new(MemoryStore::default());
/// store.enqueue(Email { id: 1, to: "a@example.com".into() });
/// let mut options = WorkerOptions::new("mailer");
/// options.num_total_jobs = Some(1);
/// let summary = Worker::new(store.clone(), Send, options)?.run().await;
/// assert_eq!(summary.dequeued, 1);
/// # Ok(()) }
/// ```
pub struct Worker<S: Store, H: Handler<S>> {
    shared: Arc<Shared<S>>,
    handler: Arc<H>,
    shutdown: ShutdownHandle,
}

impl<S: Store, H: Handler<S>> std::fmt::Debug for Worker<S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.shared.name)
            .field("hostname", &self.shared.hostname)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl<S: Store, H: Handler<S>> Worker<S, H> {
    /// Validates `options` and builds a worker. Nothing runs until [`Worker::run`].
    pub fn new(store: Arc<S>, handler: H, options: WorkerOptions) -> Result<Self, Error> {
        options.validate()?;
        let hostname = match &options.hostname {
            Some(h) => h.clone(),
            None => hostname::get()
                .map_err(Error::Hostname)?
                .to_string_lossy()
                .into_owned(),
        };
        let claim_ahead = options.claim_ahead_for(&*store);
        let concurrent_dequeues = options.concurrent_dequeues_for(&*store);
        let num_handlers = options.num_handlers;
        store
            .check_worker_options(&options, claim_ahead)
            .map_err(Error::IncompatibleOptions)?;
        let (events, _) = broadcast::channel(options.event_capacity);
        Ok(Worker {
            shared: Arc::new(Shared {
                name: Arc::from(options.name.as_str()),
                hostname,
                options,
                store,
                running: RunningSet::default(),
                claim_ahead,
                concurrent_dequeues,
                recording: Arc::new(Semaphore::new(4 * (num_handlers + claim_ahead))),
                slot_freed: Arc::new(Notify::new()),
                events,
            }),
            handler: Arc::new(handler),
            shutdown: ShutdownHandle::new(),
        })
    }

    /// A handle that stops this worker, gracefully or at once.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Receives the worker's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<WorkerEvent> {
        self.shared.events.subscribe()
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.shared.store
    }

    /// The host name recorded on claimed jobs.
    pub fn hostname(&self) -> &str {
        &self.shared.hostname
    }

    /// Runs until `num_total_jobs` or `max_active_time` is reached or a shutdown
    /// is requested, then waits for every job task and the heartbeat loop to end.
    pub async fn run(self) -> WorkerSummary {
        let span = tracing::info_span!("worker", worker = %self.shared.name);
        self.run_inner().instrument(span).await
    }

    async fn run_inner(self) -> WorkerSummary {
        let shared = &self.shared;
        let tracker = TaskTracker::new();
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat_loop(shared.clone(), heartbeat_stop.clone()));

        let (reason, dequeued) = self.dequeue_loop(&tracker).await;
        shared.emit(WorkerEvent::Draining);
        tracker.close();
        match reason {
            StopReason::Immediate => {}
            StopReason::Graceful => self.drain(&tracker).await,
            // Stopped by its own limits: jobs finish unless a shutdown arrives.
            StopReason::TotalJobsReached | StopReason::MaxActiveTimeReached => {
                tokio::select! {
                    _ = tracker.wait() => {}
                    _ = self.shutdown.stop_dequeue.cancelled() => self.drain(&tracker).await,
                }
            }
        }
        tracker.wait().await;
        heartbeat_stop.cancel();
        if let Err(err) = heartbeat.await {
            tracing::error!(error = %err, "heartbeat loop ended abnormally");
        }
        shared.emit(WorkerEvent::Stopped);
        WorkerSummary { reason, dequeued }
    }

    /// Waits up to the drain timeout for running jobs, then cancels them.
    async fn drain(&self, tracker: &TaskTracker) {
        let drain = self.shared.options.drain_timeout;
        tokio::select! {
            _ = tracker.wait() => {}
            _ = self.shutdown.cancel_jobs.cancelled() => {}
            _ = tokio::time::sleep(drain) => {
                tracing::warn!(worker = %self.shared.name, running = self.shared.running.len(), "drain timeout reached; canceling running jobs");
                self.shutdown.cancel_jobs.cancel();
            }
        }
    }

    async fn dequeue_loop(&self, tracker: &TaskTracker) -> (StopReason, u64) {
        let shared = &self.shared;
        let options = &shared.options;
        let semaphore = Arc::new(Semaphore::new(options.num_handlers));
        let deadline = options.max_active_time.map(|d| Instant::now() + d);
        let mut dequeued: u64 = 0;
        // Claimed jobs waiting for a free handler (at most `claim_ahead` once the
        // free slots are filled).
        let mut buffer: VecDeque<Claimed<S::Job>> = VecDeque::new();
        // Claims in flight, each with the number of jobs it asked for; they run
        // while buffered jobs start.
        let mut claims: FuturesUnordered<ClaimFuture<S::Job>> = FuturesUnordered::new();
        // Jobs asked for by the claims in flight: room they already took.
        let mut reserved: usize = 0;
        // The last claim came back full, so more work is likely waiting: only
        // then may a second claim start before the first returns.
        let mut busy = false;
        let capacity = options.num_handlers + shared.claim_ahead;
        let mut wakeups = shared.store.wakeups();
        let mut backoff = Backoff::new(options.interval, options.max_interval);
        // When the next claim may start; `None`: as soon as there is room.
        let mut next_claim: Option<Instant> = None;

        let reason = loop {
            // A shutdown first: buffered jobs must not start after one.
            if let Some(reason) = self.stop_reason(deadline, dequeued, false) {
                break reason;
            }
            while let Some(permit) = (!buffer.is_empty())
                .then(|| semaphore.clone().try_acquire_owned().ok())
                .flatten()
            {
                if let Some(claimed) = buffer.pop_front() {
                    self.start_job(tracker, claimed, permit).await;
                }
            }
            let settled = buffer.is_empty() && claims.is_empty();
            if let Some(reason) = self.stop_reason(deadline, dequeued, settled) {
                break reason;
            }
            let room = self.room(
                &semaphore,
                buffer.len() + reserved,
                dequeued + reserved as u64,
            );
            // While the queue is busy, each claim takes at most its share of the
            // capacity, so the next one can start before it returns: a claim is a
            // round trip, and only overlapping claims hide its latency.
            let share = capacity.div_ceil(shared.concurrent_dequeues.max(1));
            let limit = if busy { room.min(share) } else { room };
            // With jobs buffered or claimed, wait until a share (at most half
            // the capacity) is free, so claims stay large: a claim of a few rows
            // would hold up the next.
            let worth_it = settled || room >= share.min(capacity.div_ceil(2));
            if room > 0
                && worth_it
                && (claims.is_empty() || (busy && claims.len() < shared.concurrent_dequeues))
                && next_claim.is_none_or(|t| Instant::now() >= t)
            {
                match self.pre_dequeue().await {
                    Some(conditions) => {
                        if let Some(w) = &mut wakeups {
                            w.mark_seen();
                        }
                        claims.push(self.claim(conditions, limit));
                        reserved += limit;
                        next_claim = None;
                    }
                    None => next_claim = Some(Instant::now() + options.interval),
                }
            }
            let idle = claims.is_empty();
            tokio::select! {
                biased;
                _ = self.shutdown.stop_dequeue.cancelled() => {}
                _ = sleep_until_opt(deadline) => {}
                Some((asked, result)) = claims.next(), if !idle => {
                    reserved -= asked;
                    match result {
                        Ok(jobs) if jobs.is_empty() => {
                            busy = false;
                            shared.emit(WorkerEvent::Idle);
                            let live = wakeups.as_ref().map(Wakeups::is_live);
                            next_claim = Some(Instant::now() + backoff.idle(live));
                        }
                        Ok(jobs) => {
                            backoff.reset();
                            busy = jobs.len() >= asked;
                            // A short claim drained what was eligible. With live
                            // wake-ups, new work announces itself: wait for it
                            // (or the poll) instead of claiming again at once.
                            let live = wakeups.as_ref().is_some_and(Wakeups::is_live);
                            next_claim = (!busy && live).then(|| Instant::now() + options.interval);
                            for (i, job) in jobs.into_iter().enumerate() {
                                if i >= asked {
                                    self.give_back_extra(job).await;
                                    continue;
                                }
                                dequeued += 1;
                                buffer.push_back(self.register(job));
                            }
                        }
                        Err(message) => {
                            busy = false;
                            tracing::error!(error = %message, "dequeue failed");
                            shared.emit(WorkerEvent::StoreFailed { op: "dequeue", message });
                            next_claim = Some(Instant::now() + options.interval);
                        }
                    }
                }
                // A handler finished: start a buffered job in its slot.
                permit = semaphore.clone().acquire_owned(), if !buffer.is_empty() => {
                    let permit = permit.expect("the semaphore is never closed");
                    if let Some(claimed) = buffer.pop_front() {
                        self.start_job(tracker, claimed, permit).await;
                    }
                }
                // A slot freed with nothing buffered: room for a claim now, or
                // (while the queue is busy) for one more beside those in flight.
                _ = shared.slot_freed.notified(),
                    if buffer.is_empty()
                        && (room == 0 || (busy && claims.len() < shared.concurrent_dequeues)) => {}
                _ = woken(&mut wakeups), if idle && next_claim.is_some() => {
                    backoff.reset();
                    next_claim = None;
                }
                _ = sleep_until_opt(next_claim), if idle => next_claim = None,
            }
        };

        // Claims in flight may already have committed: wait for them, so their
        // jobs are handed back now rather than left to the resetter.
        while let Some((_, result)) = claims.next().await {
            if let Ok(jobs) = result {
                for job in jobs {
                    dequeued += 1;
                    buffer.push_back(self.register(job));
                }
            }
        }
        let handed_back = self.hand_back(buffer).await;
        (reason, dequeued - handed_back)
    }

    /// How many jobs the next claim may ask for: free handler slots plus the
    /// claim-ahead allowance, less what is buffered, within the job limits.
    fn room(&self, semaphore: &Semaphore, buffered: usize, dequeued: u64) -> usize {
        let options = &self.shared.options;
        let mut room =
            (semaphore.available_permits() + self.shared.claim_ahead).saturating_sub(buffered);
        if let Some(total) = options.num_total_jobs {
            room = room.min(usize::try_from(total.saturating_sub(dequeued)).unwrap_or(usize::MAX));
        }
        if let Some(max) = options.max_dequeue_batch {
            room = room.min(max);
        }
        room
    }

    /// Starts a dequeue of up to `limit` jobs; panics in the store become errors.
    fn claim(&self, conditions: S::Conditions, limit: usize) -> ClaimFuture<S::Job> {
        let shared = self.shared.clone();
        Box::pin(async move {
            let dequeue = shared.store.dequeue(&shared.hostname, &conditions, limit);
            let result = guarded("dequeue", dequeue)
                .await
                .map_err(|err| error_chain(err.as_ref()));
            (limit, result)
        })
    }

    /// Registers a claimed job as owned: from now on it is heartbeated.
    fn register(&self, job: S::Job) -> Claimed<S::Job> {
        let running = Running {
            lease: job.lease(),
            token: self.shutdown.cancel_jobs.child_token(),
            reason: Arc::default(),
        };
        self.shared.running.insert(running.clone());
        metrics::running(&self.shared.name, self.shared.running.len());
        Claimed { job, running }
    }

    /// A store returned more jobs than asked for: never exceed the limit.
    async fn give_back_extra(&self, mut job: S::Job) {
        tracing::error!(
            record_id = job.lease().id,
            "store returned more jobs than requested; requeueing"
        );
        if let Err(err) = guarded("requeue", self.shared.store.requeue(&mut job)).await {
            tracing::error!(error = %error_chain(err.as_ref()), "requeue failed");
        }
    }

    /// Hands every buffered job back to the queue at once; returns how many.
    async fn hand_back(&self, buffer: VecDeque<Claimed<S::Job>>) -> u64 {
        let shared = &self.shared;
        let count = buffer.len() as u64;
        let requeues = buffer.into_iter().map(|mut claimed| async move {
            let lease = claimed.running.lease;
            let requeued = match guarded("requeue", shared.store.requeue(&mut claimed.job)).await
            {
                Ok(done) => done,
                Err(err) => {
                    let message = error_chain(err.as_ref());
                    tracing::error!(record_id = lease.id, error = %message, "handing a buffered job back failed; the resetter will requeue it");
                    shared.emit(WorkerEvent::StoreFailed { op: "requeue", message });
                    false
                }
            };
            shared.running.remove(lease);
            shared.emit(WorkerEvent::HandedBack {
                id: lease.id,
                requeued,
            });
        });
        join_all(requeues).await;
        metrics::running(&shared.name, shared.running.len());
        count
    }

    fn stop_reason(
        &self,
        deadline: Option<Instant>,
        dequeued: u64,
        settled: bool,
    ) -> Option<StopReason> {
        if self.shutdown.cancel_jobs.is_cancelled() {
            return Some(StopReason::Immediate);
        }
        if self.shutdown.stop_dequeue.is_cancelled() {
            return Some(StopReason::Graceful);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(StopReason::MaxActiveTimeReached);
        }
        // Every claimed job must have started before the total counts as reached.
        if settled
            && self
                .shared
                .options
                .num_total_jobs
                .is_some_and(|total| dequeued >= total)
        {
            return Some(StopReason::TotalJobsReached);
        }
        None
    }

    /// Runs `pre_dequeue`; `None` means "don't dequeue this round".
    async fn pre_dequeue(&self) -> Option<S::Conditions> {
        let shared = &self.shared;
        match AssertUnwindSafe(self.handler.pre_dequeue())
            .catch_unwind()
            .await
        {
            Ok(Ok(Some(conditions))) => Some(conditions),
            Ok(Ok(None)) => {
                shared.emit(WorkerEvent::DequeueDeclined);
                None
            }
            Ok(Err(err)) => {
                tracing::error!(error = %error_chain(err.as_ref()), "pre_dequeue failed");
                shared.emit(WorkerEvent::DequeueDeclined);
                None
            }
            Err(panic) => {
                let message = panic_message(&panic);
                tracing::error!(panic = %message, "pre_dequeue panicked");
                shared.emit(WorkerEvent::HookPanicked {
                    hook: Hook::PreDequeue,
                    id: None,
                    message,
                });
                None
            }
        }
    }

    /// Runs `pre_handle` on the loop, then spawns the job's task, which owns `permit`.
    async fn start_job(
        &self,
        tracker: &TaskTracker,
        claimed: Claimed<S::Job>,
        permit: OwnedSemaphorePermit,
    ) {
        let shared = self.shared.clone();
        let handler = self.handler.clone();
        let Claimed { job, running } = claimed;
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
                let started = Instant::now();
                let mut job = job;
                let outcome = match pre_panic {
                    Some(message) => Outcome::Panicked(message),
                    None => execute(&shared, &*handler, &mut job, &running).await,
                };
                shared.running.remove(lease);
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
                let marked = record_outcome(&shared, &mut job, &outcome).await;
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
    // wait for it.
    match guarded("open", shared.store.open(job)).await {
        Ok(true) => {}
        // Someone else owns it now, or the store recorded why it cannot run.
        Ok(false) => return Outcome::Lost,
        Err(err) => {
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
    let max_runtime = shared.options.max_runtime_per_job;
    let started = Instant::now();
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
        _ = sleep_until_opt(max_runtime.map(|d| started + d)) => Outcome::TimedOut(max_runtime.unwrap_or_default()),
    };
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

/// Records the outcome in the store; returns whether the mark took effect.
async fn record_outcome<S: Store>(shared: &Shared<S>, job: &mut S::Job, outcome: &Outcome) -> bool {
    let store = &shared.store;
    let message = outcome.failure_message().unwrap_or_default();
    let (op, result) = match outcome {
        Outcome::Completed => (
            "mark_complete",
            guarded("mark_complete", store.mark_complete(job)).await,
        ),
        Outcome::Errored(_)
        | Outcome::TimedOut(_)
        | Outcome::Panicked(_)
        | Outcome::HeartbeatExpired(_) => (
            "mark_errored",
            guarded("mark_errored", store.mark_errored(job, &message)).await,
        ),
        Outcome::Failed(_) | Outcome::Canceled => (
            "mark_failed",
            guarded("mark_failed", store.mark_failed(job, &message)).await,
        ),
        Outcome::Interrupted => ("requeue", guarded("requeue", store.requeue(job)).await),
        // Someone else owns the record now: write nothing.
        Outcome::Lost => return false,
    };
    match result {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(
                op,
                "the store refused the mark: this attempt no longer owns the job"
            );
            false
        }
        Err(err) => {
            let message = error_chain(err.as_ref());
            tracing::error!(op, error = %message, "recording the outcome failed");
            shared.emit(WorkerEvent::StoreFailed { op, message });
            false
        }
    }
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

/// A claimed job and its entry in the running set.
struct Claimed<J> {
    job: J,
    running: Running,
}

/// A dequeue in flight: the number of jobs it asked for, and the claimed
/// jobs or the error rendered.
type ClaimFuture<J> = Pin<Box<dyn Future<Output = (usize, Result<Vec<J>, String>)> + Send>>;

/// Awaits the store's next wake-up; pending when it has none.
async fn woken(wakeups: &mut Option<Wakeups>) {
    match wakeups {
        Some(w) => w.woken().await,
        None => std::future::pending().await,
    }
}

/// Runs a store call, turning a panic inside it into an error, so a bug in a
/// store (or in a scan function it calls) never takes the worker down.
pub(crate) async fn guarded<T>(
    op: &'static str,
    call: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(format!("{op} panicked: {}", panic_message(&panic)).into()),
    }
}

/// The idle wait between empty dequeues: `interval`, doubling up to
/// `max_interval` while nothing is found.
#[derive(Debug)]
struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(base: Duration, max: Option<Duration>) -> Self {
        Backoff {
            base,
            max: max.unwrap_or(base),
            next: base,
        }
    }

    /// The wait after an empty dequeue. `live`: whether the store's wake-ups
    /// flow (`None`: it has none). Without live wake-ups from a store that has
    /// them, stay at the base interval: polling is all there is.
    fn idle(&mut self, live: Option<bool>) -> Duration {
        let cap = if live == Some(false) {
            self.base
        } else {
            self.max
        };
        let wait = self.next.min(cap);
        self.next = (wait * 2).min(cap);
        wait
    }

    fn reset(&mut self) {
        self.next = self.base;
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The text of a panic payload (for stores that catch panics in user code,
/// such as a scan function).
pub fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_back_off_doubles_to_its_cap_and_stays_at_the_interval_without_live_wake_ups() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), Some(s(8)));
        let waits: Vec<u64> = (0..6).map(|_| b.idle(Some(true)).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
        // The listener is down: polling is all there is.
        assert_eq!(b.idle(Some(false)), s(1));
        b.reset();
        assert_eq!(b.idle(None), s(1));
        assert_eq!(b.idle(None), s(2));
        // Without max_interval there is no back-off.
        let mut flat = Backoff::new(s(1), None);
        assert_eq!(flat.idle(Some(true)), s(1));
        assert_eq!(flat.idle(Some(true)), s(1));
    }
}
