//! `Worker<S, H>`: the dequeue loop. Read this file first.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::error::{Error, error_chain};
use crate::events::{Hook, WorkerEvent};
use crate::handler::{Handler, JobContext};
use crate::heartbeat::{CancelReason, Running, RunningSet, heartbeat_loop};
use crate::metrics;
use crate::options::WorkerOptions;
use crate::outcome::Outcome;
use crate::shutdown::ShutdownHandle;
use crate::store::{Job, Store};

/// State shared by the dequeue loop, the job tasks and the heartbeat loop.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) name: Arc<str>,
    pub(crate) hostname: String,
    pub(crate) options: WorkerOptions,
    pub(crate) store: Arc<S>,
    pub(crate) running: RunningSet,
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
        let (events, _) = broadcast::channel(options.event_capacity);
        Ok(Worker {
            shared: Arc::new(Shared {
                name: Arc::from(options.name.as_str()),
                hostname,
                options,
                store,
                running: RunningSet::default(),
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

        loop {
            if let Some(reason) = self.stop_reason(deadline, dequeued) {
                return (reason, dequeued);
            }
            // Wait for a free slot, then take every other free slot too so one
            // dequeue call can fill them all.
            let first = tokio::select! {
                permit = semaphore.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = self.shutdown.stop_dequeue.cancelled() => continue,
                _ = sleep_until_opt(deadline) => continue,
            };
            let remaining = options
                .num_total_jobs
                .map_or(usize::MAX, |t| {
                    usize::try_from(t - dequeued).unwrap_or(usize::MAX)
                })
                .min(options.max_dequeue_batch.unwrap_or(usize::MAX));
            let mut permits = vec![first];
            while permits.len() < remaining {
                match semaphore.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }

            let Some(conditions) = self.pre_dequeue().await else {
                drop(permits);
                self.wait_interval(deadline).await;
                continue;
            };

            let jobs = match shared
                .store
                .dequeue(&shared.hostname, &conditions, permits.len())
                .await
            {
                Ok(jobs) => jobs,
                Err(err) => {
                    let message = error_chain(err.as_ref());
                    tracing::error!(error = %message, "dequeue failed");
                    shared.emit(WorkerEvent::StoreFailed {
                        op: "dequeue",
                        message,
                    });
                    drop(permits);
                    self.wait_interval(deadline).await;
                    continue;
                }
            };
            if jobs.is_empty() {
                drop(permits);
                shared.emit(WorkerEvent::Idle);
                self.wait_interval(deadline).await;
                continue;
            }
            for job in jobs {
                let Some(permit) = permits.pop() else {
                    // The store returned more than asked for: never exceed the limit.
                    tracing::error!(
                        record_id = job.lease().id,
                        "store returned more jobs than requested; requeueing"
                    );
                    let mut job = job;
                    if let Err(err) = shared.store.requeue(&mut job).await {
                        tracing::error!(error = %error_chain(err.as_ref()), "requeue failed");
                    }
                    continue;
                };
                dequeued += 1;
                self.start_job(tracker, job, permit).await;
            }
            // Something was dequeued: try again at once.
        }
    }

    fn stop_reason(&self, deadline: Option<Instant>, dequeued: u64) -> Option<StopReason> {
        if self.shutdown.cancel_jobs.is_cancelled() {
            return Some(StopReason::Immediate);
        }
        if self.shutdown.stop_dequeue.is_cancelled() {
            return Some(StopReason::Graceful);
        }
        if self
            .shared
            .options
            .num_total_jobs
            .is_some_and(|total| dequeued >= total)
        {
            return Some(StopReason::TotalJobsReached);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(StopReason::MaxActiveTimeReached);
        }
        None
    }

    async fn wait_interval(&self, deadline: Option<Instant>) {
        tokio::select! {
            _ = tokio::time::sleep(self.shared.options.interval) => {}
            _ = self.shutdown.stop_dequeue.cancelled() => {}
            _ = sleep_until_opt(deadline) => {}
        }
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
    async fn start_job(&self, tracker: &TaskTracker, job: S::Job, permit: OwnedSemaphorePermit) {
        let shared = self.shared.clone();
        let handler = self.handler.clone();
        let lease = job.lease();
        let span = tracing::info_span!("job", worker = %shared.name, record_id = lease.id);
        shared.emit(WorkerEvent::Dequeued { id: lease.id });

        let running = Running {
            lease,
            token: self.shutdown.cancel_jobs.child_token(),
            reason: Arc::default(),
        };
        shared.running.insert(running.clone());
        metrics::running(&shared.name, shared.running.len());

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
                // The task owns its permit: the slot frees on every path, panics included.
                let _permit = permit;
                let started = Instant::now();
                let mut job = job;
                let outcome = match pre_panic {
                    Some(message) => Outcome::Panicked(message),
                    None => execute(&shared, &*handler, &mut job, &running).await,
                };
                shared.running.remove(lease);
                metrics::running(&shared.name, shared.running.len());
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
                tracing::debug!(outcome = outcome.kind(), marked, "job finished");
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
    let ctx = JobContext {
        store: shared.store.clone(),
        lease: running.lease,
        cancel: running.token.clone(),
        worker_name: shared.name.clone(),
    };
    let max_runtime = shared.options.max_runtime_per_job;
    let outcome = tokio::select! {
        // A handler that finished wins over a cancellation that fired at the same time.
        biased;
        result = AssertUnwindSafe(handler.handle(job, &ctx)).catch_unwind() => match result {
            Ok(Ok(())) => Outcome::Completed,
            Ok(Err(err)) => Outcome::from_handler_error(err),
            Err(panic) => {
                let message = panic_message(&panic);
                tracing::error!(panic = %message, "handle panicked");
                shared.emit(WorkerEvent::HookPanicked { hook: Hook::Handle, id: Some(running.lease.id), message: message.clone() });
                Outcome::Panicked(message)
            }
        },
        _ = running.token.cancelled() => match running.reason.get() {
            Some(CancelReason::Requested) => Outcome::Canceled,
            Some(CancelReason::Lost) => Outcome::Lost,
            Some(CancelReason::HeartbeatExpired) => {
                Outcome::HeartbeatExpired(shared.options.heartbeat_failure_limit.unwrap_or_default())
            }
            None => Outcome::Interrupted,
        },
        _ = sleep_until_opt(max_runtime.map(|d| Instant::now() + d)) => Outcome::TimedOut(max_runtime.unwrap_or_default()),
    };
    // Anything the handler spawned with the token should stop too.
    running.token.cancel();
    outcome
}

/// Records the outcome in the store; returns whether the mark took effect.
async fn record_outcome<S: Store>(shared: &Shared<S>, job: &mut S::Job, outcome: &Outcome) -> bool {
    let store = &shared.store;
    let message = outcome.failure_message().unwrap_or_default();
    let (op, result) = match outcome {
        Outcome::Completed => ("mark_complete", store.mark_complete(job).await),
        Outcome::Errored(_)
        | Outcome::TimedOut(_)
        | Outcome::Panicked(_)
        | Outcome::HeartbeatExpired(_) => ("mark_errored", store.mark_errored(job, &message).await),
        Outcome::Failed(_) | Outcome::Canceled => {
            ("mark_failed", store.mark_failed(job, &message).await)
        }
        Outcome::Interrupted => ("requeue", store.requeue(job).await),
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

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}
