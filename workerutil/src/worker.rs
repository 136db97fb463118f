//! `Worker<S, H>`: the dequeue loop. Read this file first.
//!
//! The loop claims jobs from the [`Store`] and starts one task per job
//! (`job_task`); `heartbeat` keeps the running ones alive; both read the
//! state in `running`. Idle waits are in `backoff`.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Semaphore, broadcast};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::ahead::Ahead;
use crate::backoff::{Backoff, sleep_until_opt};
use crate::error::{Error, error_chain};
use crate::events::{Hook, WorkerEvent};
use crate::handler::Handler;
use crate::heartbeat::heartbeat_loop;
use crate::job_task::start_job;
use crate::metrics;
use crate::options::WorkerOptions;
use crate::panics::{guarded, panic_message};
use crate::running::{Claimed, Running, Shared};
use crate::shutdown::ShutdownHandle;
use crate::store::{Job, Store};
use crate::wakeup::Wakeups;

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
    /// [`Worker::run_until_empty`]: a claim found nothing and no job was
    /// left running.
    QueueEmpty,
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
/// use workerutil::{Handler, HandlerError, JobContext, MemoryStore, Record, Worker, WorkerOptions};
///
/// #[derive(Clone, Debug)]
/// struct Email { id: i64, to: String }
/// impl Record for Email { fn id(&self) -> i64 { self.id } }
///
/// struct Send;
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
    /// Stop once nothing is runnable ([`Worker::run_until_empty`]).
    until_empty: bool,
    /// [`Worker::run_until`] started it (a worker runs once).
    ran: AtomicBool,
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
        let claim_ahead = crate::store::claim_ahead(&options, &*store);
        // Left to the worker, the allowance adapts between 1 and its bound;
        // a store that wants none (its claimed jobs hold a resource) gets none.
        let adaptive =
            options.claim_ahead.is_none() && options.max_per_dequeue.is_none() && claim_ahead > 0;
        let (claim_ahead, adaptive_from) = if adaptive {
            let bound = options.claim_ahead_bound();
            (bound, Some(claim_ahead.min(bound)))
        } else {
            (claim_ahead, None)
        };
        let concurrent_dequeues = crate::store::concurrent_dequeues(&options, &*store);
        store
            .check_worker_options(&options, claim_ahead)
            .map_err(Error::IncompatibleOptions)?;
        Ok(Worker {
            shared: Arc::new(Shared::new(
                store,
                options,
                hostname,
                claim_ahead,
                adaptive_from,
                concurrent_dequeues,
            )),
            handler: Arc::new(handler),
            shutdown: ShutdownHandle::new(),
            until_empty: false,
            ran: AtomicBool::new(false),
        })
    }

    /// A handle that stops this worker, gracefully or at once.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Receives the worker's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<WorkerEvent> {
        self.shared.subscribe()
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.shared.store
    }

    /// The host name recorded on claimed jobs.
    pub fn hostname(&self) -> &str {
        &self.shared.hostname
    }

    /// Runs until no runnable job is left, then returns: once a claim finds
    /// nothing while no job is running (their retries and the jobs they
    /// enqueued are claimed first), with the usual summary and reason
    /// [`StopReason::QueueEmpty`]. For tests, and for deployments where cron
    /// starts a worker that drains the queue and exits. The other stops
    /// (shutdown, `num_total_jobs`, `max_active_time`) still apply. A retry
    /// that comes due later is not waited for.
    pub async fn run_until_empty(mut self) -> WorkerSummary {
        self.until_empty = true;
        self.run().await
    }

    /// Runs until `num_total_jobs` or `max_active_time` is reached or a shutdown
    /// is requested, then waits for every job task and the heartbeat loop to end.
    pub async fn run(self) -> WorkerSummary {
        self.run_spanned().await
    }

    /// Runs as [`run`](Self::run) does, from a shared reference (a worker
    /// held by a service or an `Arc`), until `stop` fires (then a graceful
    /// shutdown: running jobs get the drain timeout) or the worker stops on
    /// its own limits. A worker runs once: a second call is refused
    /// ([`Error::AlreadyRan`]).
    pub async fn run_until(&self, stop: CancellationToken) -> Result<WorkerSummary, Error> {
        if self.ran.swap(true, Ordering::SeqCst) {
            return Err(Error::AlreadyRan);
        }
        let run = self.run_spanned();
        tokio::pin!(run);
        tokio::select! {
            summary = &mut run => return Ok(summary),
            () = stop.cancelled() => self.shutdown.graceful(),
        }
        Ok(run.await)
    }

    async fn run_spanned(&self) -> WorkerSummary {
        let span = tracing::info_span!("worker", worker = %self.shared.name);
        self.run_inner().instrument(span).await
    }

    /// The worker's name (its options' `name`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    async fn run_inner(&self) -> WorkerSummary {
        let shared = &self.shared;
        let tracker = TaskTracker::new();
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat_loop(shared.clone(), heartbeat_stop.clone()));

        let (reason, dequeued, stopped_at) = self.dequeue_loop(&tracker).await;
        shared.emit(WorkerEvent::Draining);
        tracker.close();
        let drain = shared.options.drain_timeout;
        let running = || shared.running.len();
        match reason {
            StopReason::Immediate => {}
            // One drain from the shutdown, the wait for claims in flight included.
            StopReason::Graceful => {
                let until = stopped_at + drain;
                self.shutdown
                    .drain(&tracker, until, &shared.name, running)
                    .await;
            }
            // Stopped by its own limits: jobs finish unless a shutdown arrives.
            StopReason::TotalJobsReached
            | StopReason::MaxActiveTimeReached
            | StopReason::QueueEmpty => {
                tokio::select! {
                    _ = tracker.wait() => {}
                    _ = self.shutdown.stop_dequeue.cancelled() => {
                        let until = Instant::now() + drain;
                        self.shutdown.drain(&tracker, until, &shared.name, running).await;
                    }
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

    /// Claims until told to stop: why, how many jobs it kept, and when.
    async fn dequeue_loop(&self, tracker: &TaskTracker) -> (StopReason, u64, Instant) {
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
        let mut ahead = match shared.adaptive_from {
            Some(initial) => Ahead::adaptive(initial, shared.claim_ahead),
            None => Ahead::fixed(shared.claim_ahead),
        };
        let mut wakeups = shared.store.wakeups();
        let mut backoff = Backoff::new(options.interval, options.max_interval);
        // When the next claim may start; `None`: as soon as there is room.
        let mut next_claim: Option<Instant> = None;

        let reason = loop {
            // A shutdown first: buffered jobs must not start after one.
            if let Some(reason) = self.stop_reason(deadline, dequeued, false) {
                break reason;
            }
            // Each start awaits `pre_handle`: a shutdown meanwhile leaves the
            // rest of the buffer to be handed back.
            while let Some(permit) = (!buffer.is_empty()
                && !self.shutdown.stop_dequeue.is_cancelled())
            .then(|| semaphore.clone().try_acquire_owned().ok())
            .flatten()
            {
                if let Some(claimed) = buffer.pop_front() {
                    ahead.job_started();
                    start_job(&self.shared, &self.handler, tracker, claimed, permit).await;
                }
            }
            let settled = buffer.is_empty() && claims.is_empty();
            if let Some(reason) = self.stop_reason(deadline, dequeued, settled) {
                break reason;
            }
            let capacity = options.num_handlers + ahead.get();
            let room = self.room(
                &semaphore,
                ahead.get(),
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
                Some((asked, took, result, recorded_before)) = claims.next(), if !idle => {
                    reserved -= asked;
                    ahead.claim_returned(took);
                    match result {
                        Ok(jobs) if jobs.is_empty() => {
                            busy = false;
                            // Empty only if no job was still being written: a
                            // retry's mark that lands after this claim began
                            // makes the job runnable again.
                            if self.until_empty
                                && buffer.is_empty()
                                && claims.is_empty()
                                && tracker.is_empty()
                                && shared.recorded.load(Ordering::SeqCst) == recorded_before
                            {
                                break StopReason::QueueEmpty;
                            }
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
                        ahead.job_started();
                        start_job(&self.shared, &self.handler, tracker, claimed, permit).await;
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
        // jobs are handed back now rather than left to the resetter; but no
        // longer than the drain timeout (a claim stuck on a lock or a dead
        // connection must not hold the shutdown), and not at all once jobs are
        // cancelled. What an abandoned claim took, the resetter takes back.
        let stopped_at = Instant::now();
        if !claims.is_empty() {
            let give_up = tokio::time::sleep_until(stopped_at + options.drain_timeout);
            tokio::pin!(give_up);
            loop {
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancel_jobs.cancelled() => break,
                    () = &mut give_up => break,
                    next = claims.next() => match next {
                        Some((_, _, Ok(jobs), _)) => {
                            for job in jobs {
                                dequeued += 1;
                                buffer.push_back(self.register(job));
                            }
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            if !claims.is_empty() {
                tracing::warn!(worker = %shared.name, claims = claims.len(), "shutdown: claims still in flight abandoned; the resetter takes back what they claimed");
            }
        }
        let handed_back = self.hand_back(buffer).await;
        (reason, dequeued - handed_back, stopped_at)
    }

    /// How many jobs the next claim may ask for: free handler slots plus the
    /// claim-ahead allowance, less what is buffered, within the job limits.
    fn room(&self, semaphore: &Semaphore, ahead: usize, buffered: usize, dequeued: u64) -> usize {
        let options = &self.shared.options;
        let mut room = (semaphore.available_permits() + ahead).saturating_sub(buffered);
        if let Some(total) = options.num_total_jobs {
            room = room.min(usize::try_from(total.saturating_sub(dequeued)).unwrap_or(usize::MAX));
        }
        if let Some(max) = options.max_per_dequeue {
            room = room.min(max);
        }
        room
    }

    /// Starts a dequeue of up to `limit` jobs; panics in the store become errors.
    fn claim(&self, conditions: S::Conditions, limit: usize) -> ClaimFuture<S::Job> {
        let shared = self.shared.clone();
        Box::pin(async move {
            let recorded = shared.recorded.load(Ordering::SeqCst);
            let started = Instant::now();
            let dequeue = shared.store.dequeue(&shared.hostname, &conditions, limit);
            let result = guarded("dequeue", dequeue)
                .await
                .map_err(|err| error_chain(err.as_ref()));
            (limit, started.elapsed(), result, recorded)
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
}

/// A claim in flight: resolves to the number of jobs it asked for, how long
/// it took, the claimed jobs or the error rendered, and how many outcomes had
/// been written when it began.
type ClaimFuture<J> =
    Pin<Box<dyn Future<Output = (usize, Duration, Result<Vec<J>, String>, u64)> + Send>>;

/// Awaits the store's next wake-up; pending when it has none.
async fn woken(wakeups: &mut Option<Wakeups>) {
    match wakeups {
        Some(w) => w.woken().await,
        None => std::future::pending().await,
    }
}
