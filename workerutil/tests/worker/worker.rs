//! Behaviour of `Worker` over the in-memory store, on tokio's paused clock:
//! nothing here sleeps in real time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use workerutil::testing::{finished, wait_for};
use workerutil::{
    BoxError, DEFAULT_MAX_CLAIM_AHEAD, Handler, HandlerError, HeartbeatResult, Hook, JobContext,
    JobState, Lease, MemoryConditions, MemoryJob, MemoryStore, MemoryStoreOptions, Outcome, Record,
    RecordId, StopReason, Store, Worker, WorkerEvent, WorkerOptions,
};

/// What the test handler does with a job.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    Succeed,
    Sleep(Duration),
    Forever,
    Retryable,
    Poison,
    PanicInPreHandle,
    PanicInHandle,
    PanicInPostHandle,
}

#[derive(Debug, Clone)]
struct Task {
    id: RecordId,
    act: Act,
}

impl Record for Task {
    fn id(&self) -> RecordId {
        self.id
    }
}

/// A store wrapper whose heartbeats can be made to fail, and that records the
/// `limit` of every dequeue call.
#[derive(Default)]
struct Flaky {
    inner: MemoryStore<Task>,
    fail_heartbeats: AtomicBool,
    limits: Mutex<Vec<usize>>,
    /// How long each heartbeat takes (on tokio's clock) before it reads the store.
    heartbeat_delay: Mutex<Duration>,
    /// Hide the inner store's wake-ups (a store without LISTEN).
    no_wakeups: bool,
    /// How long each `mark_complete` takes (on tokio's clock).
    mark_delay: Mutex<Duration>,
    /// How long each `mark_errored` takes (on tokio's clock).
    errored_mark_delay: Mutex<Duration>,
    /// How long each dequeue takes (on tokio's clock) before it reads the store.
    dequeue_delay: Mutex<Duration>,
    /// Dequeue calls running now, and the most ever running at once.
    dequeues: AtomicUsize,
    max_dequeues: AtomicUsize,
    /// `open` resets this job first (a resetter between the two phases).
    reset_before_open: Mutex<Option<RecordId>>,
    /// `open` fails for this job (its connection could not be had).
    fail_open: Mutex<Option<RecordId>>,
    /// How long each `open` takes (on tokio's clock): a wait for a connection.
    open_delay: Mutex<Duration>,
    /// Suggest no claim-ahead (as a store whose claimed jobs hold a resource).
    no_claim_ahead: bool,
    /// `mark_complete` of this job answers that its commit failed.
    refuse_completion: Mutex<Option<RecordId>>,
    /// ... wrapped in another error, as a store wrapping its errors would.
    wrap_refusal: bool,
}

impl Flaky {
    /// Queues jobs that succeed, with these ids.
    fn enqueue_succeeding(&self, ids: std::ops::RangeInclusive<RecordId>) {
        for id in ids {
            self.inner.enqueue(Task {
                id,
                act: Act::Succeed,
            });
        }
    }
}
impl Store for Flaky {
    type Record = Task;
    type Job = MemoryJob<Task>;
    type Conditions = MemoryConditions<Task>;

    fn default_claim_ahead(&self, num_handlers: usize) -> usize {
        if self.no_claim_ahead { 0 } else { num_handlers }
    }

    fn wakeups(&self) -> Option<workerutil::Wakeups> {
        if self.no_wakeups {
            None
        } else {
            self.inner.wakeups()
        }
    }
    async fn queued_count(&self) -> Result<u64, BoxError> {
        self.inner.queued_count().await
    }
    async fn dequeue(
        &self,
        host: &str,
        c: &Self::Conditions,
        limit: usize,
    ) -> Result<Vec<Self::Job>, BoxError> {
        self.limits.lock().unwrap().push(limit);
        let now = self.dequeues.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_dequeues.fetch_max(now, Ordering::SeqCst);
        let delay = *self.dequeue_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let jobs = self.inner.dequeue(host, c, limit).await;
        self.dequeues.fetch_sub(1, Ordering::SeqCst);
        jobs
    }
    async fn open(&self, job: &mut Self::Job) -> Result<bool, BoxError> {
        let id = workerutil::Job::lease(job).id;
        if *self.fail_open.lock().unwrap() == Some(id) {
            return Err("no connection for the job's transaction".into());
        }
        let delay = *self.open_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let reset = self.reset_before_open.lock().unwrap().take_if(|r| *r == id);
        if reset.is_some() {
            self.inner.reset(id);
        }
        self.inner.open(job).await
    }
    async fn heartbeat(&self, leases: &[Lease]) -> Result<HeartbeatResult, BoxError> {
        if self.fail_heartbeats.load(Ordering::SeqCst) {
            return Err("database unreachable".into());
        }
        let delay = *self.heartbeat_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        self.inner.heartbeat(leases).await
    }
    async fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &workerutil::ExecutionLogEntry,
    ) -> Result<Option<usize>, BoxError> {
        self.inner.add_execution_log_entry(lease, entry).await
    }
    async fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &workerutil::ExecutionLogEntry,
    ) -> Result<bool, BoxError> {
        self.inner
            .update_execution_log_entry(lease, index, entry)
            .await
    }
    async fn mark_complete(&self, job: &mut Self::Job) -> Result<bool, BoxError> {
        let delay = *self.mark_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if *self.refuse_completion.lock().unwrap() == Some(workerutil::Job::lease(job).id) {
            let cause = BoxError::from("deferred constraint violated at commit");
            let answer = workerutil::Error::CompletionFailed(cause);
            if self.wrap_refusal {
                return Err(workerutil::Error::Store {
                    op: "mark_complete",
                    source: answer.into(),
                }
                .into());
            }
            return Err(answer.into());
        }
        self.inner.mark_complete(job).await
    }
    async fn mark_errored(
        &self,
        job: &mut Self::Job,
        m: &str,
        retry: Option<&workerutil::Retry>,
    ) -> Result<Option<JobState>, BoxError> {
        let delay = *self.errored_mark_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        self.inner.mark_errored(job, m, retry).await
    }
    async fn mark_failed(&self, job: &mut Self::Job, m: &str) -> Result<bool, BoxError> {
        self.inner.mark_failed(job, m).await
    }
    async fn requeue(&self, job: &mut Self::Job) -> Result<bool, BoxError> {
        self.inner.requeue(job).await
    }
    async fn mark_snoozed(&self, job: &mut Self::Job, delay: Duration) -> Result<bool, BoxError> {
        self.inner.mark_snoozed(job, delay).await
    }
}

/// The test handler: acts per job, counts concurrency, and can gate dequeues.
#[derive(Default)]
struct Acts {
    active: AtomicUsize,
    max_active: AtomicUsize,
    allow_dequeue: Option<Arc<AtomicBool>>,
    panic_pre_dequeue_once: AtomicBool,
    only_even: bool,
    pre_handled: Mutex<Vec<RecordId>>,
    handled: Mutex<Vec<RecordId>>,
    post_handled: Mutex<Vec<(RecordId, &'static str)>>,
}
impl<S> Handler<S> for Acts
where
    S: Store<Record = Task, Conditions = MemoryConditions<Task>>,
{
    async fn pre_dequeue(&self) -> Result<Option<MemoryConditions<Task>>, BoxError> {
        if self.panic_pre_dequeue_once.swap(false, Ordering::SeqCst) {
            panic!("pre_dequeue exploded");
        }
        if let Some(allow) = &self.allow_dequeue
            && !allow.load(Ordering::SeqCst)
        {
            return Ok(None);
        }
        if self.only_even {
            return Ok(Some(MemoryConditions::filter(|t: &Task| t.id % 2 == 0)));
        }
        Ok(Some(MemoryConditions::default()))
    }

    async fn pre_handle(&self, record: &Task) {
        if record.act == Act::PanicInPreHandle {
            panic!("pre_handle exploded on {}", record.id);
        }
        self.pre_handled.lock().unwrap().push(record.id);
    }

    async fn handle(&self, job: &mut S::Job, _ctx: &JobContext<S>) -> Result<(), HandlerError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active.fetch_max(now, Ordering::SeqCst);
        let _guard = Decrement(&self.active);
        self.handled
            .lock()
            .unwrap()
            .push(workerutil::Job::record(job).id);
        match workerutil::Job::record(job).act {
            Act::Succeed | Act::PanicInPreHandle | Act::PanicInPostHandle => Ok(()),
            Act::Sleep(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Act::Forever => {
                std::future::pending::<()>().await;
                Ok(())
            }
            Act::Retryable => Err(std::io::Error::other("upstream timed out").into()),
            Act::Poison => Err(HandlerError::non_retryable("payload is not valid JSON")),
            Act::PanicInHandle => panic!("handle exploded"),
        }
    }

    async fn post_handle(&self, record: &Task, outcome: &Outcome) {
        self.post_handled
            .lock()
            .unwrap()
            .push((record.id, outcome.kind()));
        if record.act == Act::PanicInPostHandle {
            panic!("post_handle exploded");
        }
    }
}

struct Decrement<'a>(&'a AtomicUsize);
impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn store_with(acts: &[Act]) -> Arc<MemoryStore<Task>> {
    let store = Arc::new(MemoryStore::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 0;
        o.max_num_resets = 5;
        o
    }));
    for (i, act) in acts.iter().enumerate() {
        store.enqueue(Task {
            id: i as i64 + 1,
            act: *act,
        });
    }
    store
}

fn options() -> WorkerOptions {
    let mut o = WorkerOptions::new("test-worker");
    o.hostname = Some("test-host".into());
    o.interval = Duration::from_millis(100);
    o.heartbeat_interval = Duration::from_millis(500);
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    o.event_capacity = 8192;
    o
}

/// Waits for the first event matching `pick`.
#[tokio::test(start_paused = true)]
async fn concurrency_limit_is_never_exceeded_over_1000_jobs() {
    let acts: Vec<Act> = (0..1000)
        .map(|i| Act::Sleep(Duration::from_millis(10 + i % 7)))
        .collect();
    let store = store_with(&acts);
    let handler = Acts::default();
    let mut o = options();
    o.num_handlers = 8;
    o.num_total_jobs = Some(1000);
    let worker = Worker::new(store.clone(), handler, o).unwrap();
    let summary = worker.run().await;
    assert_eq!(summary.reason, StopReason::TotalJobsReached);
    assert_eq!(summary.dequeued, 1000);
    assert_eq!(store.count(JobState::Completed), 1000);
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_used_up_to_the_limit_and_not_beyond() {
    let acts: Vec<Act> = (0..1000)
        .map(|i| Act::Sleep(Duration::from_millis(10 + i % 7)))
        .collect();
    let store = store_with(&acts);
    let handler = Arc::new(Acts::default());
    let mut o = options();
    o.num_handlers = 8;
    o.num_total_jobs = Some(1000);
    let worker = Worker::new(store.clone(), handler.clone(), o).unwrap();
    worker.run().await;
    assert_eq!(
        handler.max_active.load(Ordering::SeqCst),
        8,
        "8 handlers must run at once, never more"
    );
    assert_eq!(store.count(JobState::Completed), 1000);
}

#[tokio::test(start_paused = true)]
async fn num_total_jobs_stops_the_worker() {
    let store = store_with(&[Act::Succeed; 10]);
    let mut o = options();
    o.num_handlers = 3;
    o.num_total_jobs = Some(4);
    let summary = Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run()
        .await;
    assert_eq!(summary.reason, StopReason::TotalJobsReached);
    assert_eq!(summary.dequeued, 4);
    assert_eq!(store.count(JobState::Completed), 4);
    assert_eq!(store.count(JobState::Queued), 6);
}

#[tokio::test(start_paused = true)]
async fn max_active_time_stops_the_worker_and_running_jobs_finish() {
    let store = store_with(&[Act::Sleep(Duration::from_secs(1)); 100]);
    let mut o = options();
    o.max_active_time = Some(Duration::from_millis(3500));
    let started = tokio::time::Instant::now();
    let summary = Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run()
        .await;
    assert_eq!(summary.reason, StopReason::MaxActiveTimeReached);
    // Jobs start at 0s, 1s, 2s and 3s; the one started at 3s still finishes.
    assert_eq!(summary.dequeued, 4);
    assert_eq!(store.count(JobState::Completed), 4);
    assert_eq!(store.count(JobState::Queued), 96);
    assert_eq!(started.elapsed(), Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn pre_dequeue_false_pauses_dequeuing() {
    let store = store_with(&[Act::Succeed; 2]);
    let allow = Arc::new(AtomicBool::new(false));
    let handler = Acts {
        allow_dequeue: Some(allow.clone()),
        ..Default::default()
    };
    let mut o = options();
    o.num_total_jobs = Some(2);
    let worker = Worker::new(store.clone(), handler, o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    for _ in 0..5 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::DequeueDeclined).then_some(())
        })
        .await;
    }
    assert_eq!(
        store.count(JobState::Queued),
        2,
        "nothing may be dequeued while pre_dequeue declines"
    );
    allow.store(true, Ordering::SeqCst);
    let summary = run.await.unwrap();
    assert_eq!(summary.dequeued, 2);
    assert_eq!(store.count(JobState::Completed), 2);
}

#[tokio::test(start_paused = true)]
async fn extra_conditions_reach_the_store() {
    let store = store_with(&[Act::Succeed; 6]);
    let handler = Acts {
        only_even: true,
        ..Default::default()
    };
    let mut o = options();
    o.num_total_jobs = Some(3);
    o.num_handlers = 6;
    Worker::new(store.clone(), handler, o).unwrap().run().await;
    for id in [2, 4, 6] {
        assert_eq!(store.state(id), Some(JobState::Completed), "job {id}");
    }
    for id in [1, 3, 5] {
        assert_eq!(store.state(id), Some(JobState::Queued), "job {id}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_any_hook_is_recorded_and_the_worker_goes_on() {
    let store = store_with(&[
        Act::PanicInPreHandle,
        Act::PanicInHandle,
        Act::PanicInPostHandle,
        Act::Succeed,
    ]);
    let handler = Arc::new(Acts {
        panic_pre_dequeue_once: AtomicBool::new(true),
        ..Default::default()
    });
    let mut o = options();
    o.num_total_jobs = Some(4);
    // One handler: the worker only goes on if every panic path frees its slot.
    o.num_handlers = 1;
    let worker = Worker::new(store.clone(), handler.clone(), o).unwrap();
    let mut events = worker.subscribe();
    let summary = worker.run().await;
    assert_eq!(summary.dequeued, 4);

    let mut panics = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let WorkerEvent::HookPanicked { hook, id, message } = e {
            panics.push((hook, id, message));
        }
    }
    let hooks: Vec<_> = panics.iter().map(|(h, id, _)| (*h, *id)).collect();
    assert_eq!(
        hooks,
        vec![
            (Hook::PreDequeue, None),
            (Hook::PreHandle, Some(1)),
            (Hook::Handle, Some(2)),
            (Hook::PostHandle, Some(3))
        ]
    );
    let s1 = store.snapshot(1).unwrap();
    assert_eq!(
        s1.state,
        JobState::Failed,
        "no retries configured, so the errored mark is final"
    );
    assert_eq!(
        s1.failure_message.as_deref(),
        Some("handler panicked: pre_handle exploded on 1")
    );
    let s2 = store.snapshot(2).unwrap();
    assert_eq!(
        s2.failure_message.as_deref(),
        Some("handler panicked: handle exploded")
    );
    assert_eq!(
        store.state(3),
        Some(JobState::Completed),
        "post_handle runs after the mark"
    );
    assert_eq!(store.state(4), Some(JobState::Completed));
    // post_handle ran for every job, including the one whose pre_handle panicked.
    let post: Vec<_> = handler.post_handled.lock().unwrap().clone();
    assert_eq!(
        post,
        vec![
            (1, "panicked"),
            (2, "panicked"),
            (3, "completed"),
            (4, "completed")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn retryable_and_poison_errors_map_to_errored_and_failed() {
    let store = Arc::new(MemoryStore::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 3;
        o
    }));
    store.enqueue(Task {
        id: 1,
        act: Act::Retryable,
    });
    store.enqueue(Task {
        id: 2,
        act: Act::Poison,
    });
    let mut o = options();
    o.num_total_jobs = Some(2);
    o.num_handlers = 2;
    Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run()
        .await;
    let s1 = store.snapshot(1).unwrap();
    assert_eq!(s1.state, JobState::Errored);
    assert_eq!(s1.failure_message.as_deref(), Some("upstream timed out"));
    let s2 = store.snapshot(2).unwrap();
    assert_eq!(s2.state, JobState::Failed, "a poison error is not retried");
    assert_eq!(
        s2.failure_message.as_deref(),
        Some("payload is not valid JSON")
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_past_its_maximum_runtime_is_errored() {
    let store = store_with(&[Act::Forever, Act::Sleep(Duration::from_secs(4))]);
    let mut o = options();
    o.max_runtime_per_job = Some(Duration::from_secs(5));
    o.num_total_jobs = Some(2);
    o.num_handlers = 2;
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(worker.run());
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(outcome, Outcome::TimedOut(d) if d == Duration::from_secs(5)));
    assert!(marked);
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    run.await.unwrap();
    assert_eq!(
        store.snapshot(1).unwrap().failure_message.as_deref(),
        Some("job exceeded maximum runtime of 5s")
    );
    assert_eq!(
        store.state(2),
        Some(JobState::Completed),
        "a job within the limit is untouched"
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_through_the_store_cancels_the_handler() {
    let store = store_with(&[Act::Forever]);
    let mut o = options();
    o.num_total_jobs = Some(1);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    let asked = tokio::time::Instant::now();
    store.request_cancel(1);
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(outcome, Outcome::Canceled), "{outcome:?}");
    assert!(marked);
    assert!(
        asked.elapsed() <= Duration::from_millis(500),
        "canceled within one heartbeat interval"
    );
    run.await.unwrap();
    assert_eq!(store.state(1), Some(JobState::Canceled));
}

#[tokio::test(start_paused = true)]
async fn a_job_the_store_lost_is_canceled_and_not_written() {
    let store = store_with(&[Act::Forever]);
    let mut o = options();
    o.num_total_jobs = Some(1);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    // A resetter requeues it behind the worker's back.
    assert_eq!(store.reset(1), Some(JobState::Queued));
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(outcome, Outcome::Lost), "{outcome:?}");
    assert!(!marked, "a lost job must not be written");
    run.await.unwrap();
    assert_eq!(
        store.state(1),
        Some(JobState::Queued),
        "the requeued job is left for its next owner"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_heartbeat_is_retried_and_cancels_nothing() {
    let store = Arc::new(Flaky {
        fail_heartbeats: AtomicBool::new(true),
        ..Default::default()
    });
    store.inner.enqueue(Task {
        id: 1,
        act: Act::Sleep(Duration::from_secs(3)),
    });
    let mut o = options();
    o.num_total_jobs = Some(1);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    for _ in 0..3 {
        wait_for(&mut events, |e| {
            matches!(
                e,
                WorkerEvent::StoreFailed {
                    op: "heartbeat",
                    ..
                }
            )
            .then_some(())
        })
        .await;
    }
    store.fail_heartbeats.store(false, Ordering::SeqCst);
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(outcome, Outcome::Completed), "{outcome:?}");
    assert!(marked);
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn heartbeats_failing_past_the_limit_cancel_running_jobs() {
    let store = Arc::new(Flaky {
        fail_heartbeats: AtomicBool::new(true),
        ..Default::default()
    });
    store.inner.enqueue(Task {
        id: 1,
        act: Act::Forever,
    });
    let mut o = options();
    o.num_total_jobs = Some(1);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(worker.run());
    let (outcome, _) = wait_for(&mut events, finished(1)).await;
    assert!(
        matches!(outcome, Outcome::HeartbeatExpired(d) if d == Duration::from_secs(5)),
        "{outcome:?}"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(5) && elapsed <= Duration::from_millis(5500),
        "{elapsed:?}"
    );
    run.await.unwrap();
    assert_eq!(store.inner.state(1), Some(JobState::Failed));
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_running_jobs_finish() {
    let store = store_with(&[
        Act::Sleep(Duration::from_secs(2)),
        Act::Sleep(Duration::from_secs(3)),
        Act::Succeed,
    ]);
    let mut o = options();
    o.num_handlers = 2;
    o.drain_timeout = Duration::from_secs(10);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 2 }).then_some(())
    })
    .await;
    shutdown.graceful();
    let summary = run.await.unwrap();
    assert_eq!(summary.reason, StopReason::Graceful);
    assert_eq!(store.state(1), Some(JobState::Completed));
    assert_eq!(store.state(2), Some(JobState::Completed));
    assert_eq!(
        store.state(3),
        Some(JobState::Queued),
        "nothing is dequeued after a graceful shutdown"
    );
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_cancels_and_requeues_jobs_past_the_drain_timeout() {
    let store = store_with(&[Act::Forever, Act::Sleep(Duration::from_secs(1))]);
    let mut o = options();
    o.num_handlers = 2;
    o.drain_timeout = Duration::from_secs(5);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 2 }).then_some(())
    })
    .await;
    let asked = tokio::time::Instant::now();
    shutdown.graceful();
    let summary = run.await.unwrap();
    assert_eq!(
        asked.elapsed(),
        Duration::from_secs(5),
        "the drain is bounded"
    );
    assert_eq!(summary.reason, StopReason::Graceful);
    assert_eq!(
        store.state(1),
        Some(JobState::Queued),
        "an interrupted job goes back to the queue"
    );
    assert_eq!(
        store.snapshot(1).unwrap().num_failures,
        0,
        "an interruption is not a failure"
    );
    assert_eq!(store.state(2), Some(JobState::Completed));
}

#[tokio::test(start_paused = true)]
async fn immediate_shutdown_cancels_everything_at_once() {
    let store = store_with(&[Act::Forever, Act::Forever, Act::Succeed]);
    let mut o = options();
    o.num_handlers = 2;
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 2 }).then_some(())
    })
    .await;
    let asked = tokio::time::Instant::now();
    shutdown.immediate();
    let summary = run.await.unwrap();
    assert_eq!(asked.elapsed(), Duration::ZERO);
    assert_eq!(summary.reason, StopReason::Immediate);
    assert_eq!(store.state(1), Some(JobState::Queued));
    assert_eq!(store.state(2), Some(JobState::Queued));
    assert_eq!(store.state(3), Some(JobState::Queued));
}

#[tokio::test(start_paused = true)]
async fn an_errored_job_is_retried_after_its_delay() {
    let store = Arc::new(MemoryStore::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 1;
        o.retry_after = Duration::from_secs(60);
        o
    }));
    store.enqueue(Task {
        id: 1,
        act: Act::Retryable,
    });
    let mut o = options();
    o.num_total_jobs = Some(2);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, finished(1)).await;
    assert_eq!(store.state(1), Some(JobState::Errored));
    wait_for(&mut events, finished(1)).await;
    assert!(
        started.elapsed() >= Duration::from_secs(60),
        "retried before its delay"
    );
    run.await.unwrap();
    assert_eq!(store.state(1), Some(JobState::Failed), "out of retries");
    assert_eq!(store.snapshot(1).unwrap().num_failures, 2);
}

#[test]
fn invalid_options_are_an_error_not_a_panic() {
    let mut o = options();
    o.num_handlers = 0;
    let err = Worker::new(store_with(&[]), Acts::default(), o).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid option `num_handlers`: must be at least 1"
    );
    // Times added to the clock or multiplied, and a channel's size: refused
    // by name rather than overflowing (or allocating) at start or at run.
    let huge = Duration::from_secs(300_000_000_000 * 365 * 24 * 3600);
    type Breaker = Box<dyn Fn(&mut WorkerOptions)>;
    let breakers: [(&str, Breaker); 4] = [
        (
            "heartbeat_interval",
            Box::new(move |o| o.heartbeat_interval = huge),
        ),
        (
            "max_active_time",
            Box::new(|o| o.max_active_time = Some(Duration::MAX)),
        ),
        ("interval", Box::new(move |o| o.interval = huge)),
        (
            "event_capacity",
            Box::new(|o| o.event_capacity = usize::MAX / 2 + 2),
        ),
    ];
    for (field, set) in breakers {
        let mut o = options();
        set(&mut o);
        let err = Worker::new(store_with(&[]), Acts::default(), o).unwrap_err();
        assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn one_dequeue_fills_every_free_slot_unless_the_batch_is_capped() {
    for (cap, first_limit) in [(None, 5), (Some(2), 2)] {
        let store = Arc::new(Flaky::default());
        for id in 1..=5 {
            store.inner.enqueue(Task {
                id,
                act: Act::Sleep(Duration::from_secs(1)),
            });
        }
        let mut o = options();
        o.num_handlers = 5;
        o.num_total_jobs = Some(5);
        o.max_per_dequeue = cap;
        Worker::new(store.clone(), Acts::default(), o)
            .unwrap()
            .run()
            .await;
        let limits = store.limits.lock().unwrap().clone();
        assert_eq!(limits[0], first_limit, "cap {cap:?}: {limits:?}");
        assert!(
            limits.iter().all(|l| *l <= first_limit),
            "cap {cap:?}: {limits:?}"
        );
        assert_eq!(store.inner.count(JobState::Completed), 5);
    }
}

#[test]
fn outcomes_and_panics_are_counted_in_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A current-thread runtime keeps every task on this thread, where the recorder is installed.
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let store =
                    store_with(&[Act::Succeed, Act::Succeed, Act::Poison, Act::PanicInHandle]);
                let mut o = options();
                o.num_total_jobs = Some(4);
                Worker::new(store, Acts::default(), o).unwrap().run().await;
            })
    });
    let mut counters = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            counters.insert(format!("{}{{{}}}", key.key().name(), labels.join(",")), n);
        }
    }
    let get = |k: &str| counters.get(k).copied().unwrap_or(0);
    assert_eq!(
        get("workerutil_jobs_total{worker=test-worker,outcome=completed}"),
        2,
        "{counters:?}"
    );
    assert_eq!(
        get("workerutil_jobs_total{worker=test-worker,outcome=failed}"),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get("workerutil_jobs_total{worker=test-worker,outcome=panicked}"),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get("workerutil_hook_panics_total{worker=test-worker,hook=handle}"),
        1,
        "{counters:?}"
    );
}

/// Jobs 1..=n that each wait on `gate` (so they stay running until released).
fn gated_store(n: i64) -> Arc<MemoryStore<Task>> {
    let store = store_with(&[]);
    for id in 1..=n {
        store.enqueue(Task {
            id,
            act: Act::Forever,
        });
    }
    store
}

#[tokio::test(start_paused = true)]
async fn claim_ahead_never_exceeds_its_bound_and_graceful_shutdown_hands_the_buffer_back() {
    let store = gated_store(20);
    let mut o = options();
    o.num_handlers = 2;
    o.claim_ahead = Some(3);
    o.drain_timeout = Duration::from_secs(10);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    // Two handlers run, three jobs wait in the buffer: five claimed, never more.
    for _ in 0..2 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
        })
        .await;
    }
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            store.count(JobState::Processing),
            5,
            "2 running + 3 buffered"
        );
    }
    shutdown.graceful();
    let mut handed_back = Vec::new();
    while handed_back.len() < 3 {
        handed_back.push(
            wait_for(&mut events, |e| match e {
                WorkerEvent::HandedBack { id, requeued } => Some((*id, *requeued)),
                _ => None,
            })
            .await,
        );
    }
    // The buffer goes back at once, while the running jobs still drain.
    assert!(handed_back.iter().all(|(_, requeued)| *requeued));
    for (id, _) in &handed_back {
        assert_eq!(store.state(*id), Some(JobState::Queued));
    }
    assert_eq!(store.count(JobState::Processing), 2);
    let summary = run.await.unwrap();
    assert_eq!(summary.reason, StopReason::Graceful);
    assert_eq!(summary.dequeued, 2, "only started jobs count as dequeued");
    assert_eq!(store.count(JobState::Processing), 0);
    assert_eq!(store.count(JobState::Queued), 20);
}

#[tokio::test(start_paused = true)]
async fn immediate_shutdown_hands_the_buffer_back_too() {
    let store = gated_store(10);
    let mut o = options();
    o.num_handlers = 3;
    o.claim_ahead = Some(4);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..3 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Dequeued { .. }).then_some(())
        })
        .await;
    }
    wait_for(&mut events, |_| {
        (store.count(JobState::Processing) == 7).then_some(())
    })
    .await;
    shutdown.immediate();
    run.await.unwrap();
    assert_eq!(store.count(JobState::Processing), 0);
    assert_eq!(store.count(JobState::Queued), 10);
}

#[tokio::test(start_paused = true)]
async fn claim_ahead_fills_the_buffer_in_one_claim() {
    let store = Arc::new(Flaky::default());
    for id in 1..=40 {
        store.inner.enqueue(Task {
            id,
            act: Act::Sleep(Duration::from_millis(50)),
        });
    }
    let mut o = options();
    o.num_handlers = 4;
    o.num_total_jobs = Some(40);
    Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run()
        .await;
    let limits = store.limits.lock().unwrap().clone();
    // By default a worker claims its free slots plus as many again.
    assert_eq!(limits[0], 8, "{limits:?}");
    assert!(limits.iter().all(|l| *l <= 8), "{limits:?}");
    assert_eq!(store.inner.count(JobState::Completed), 40);
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_starts_a_job_at_once_and_idle_polls_back_off() {
    let store = Arc::new(MemoryStore::<Task>::default());
    let mut o = options();
    o.interval = Duration::from_secs(1);
    o.max_interval = Some(Duration::from_secs(8));
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    // Idle polls come at 1, 2, 4, 8, 8 s apart.
    let mut at = Vec::new();
    for _ in 0..6 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Idle).then_some(())
        })
        .await;
        at.push(tokio::time::Instant::now());
    }
    let gaps: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, [1, 2, 4, 8, 8]);
    // Mid-way through an 8 s wait, an enqueue wakes the worker with no time passing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let enqueued_at = tokio::time::Instant::now();
    store.enqueue(Task {
        id: 1,
        act: Act::Succeed,
    });
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    assert_eq!(tokio::time::Instant::now(), enqueued_at);
    // A find resets the back-off: the next idle polls are 1 s apart again.
    let mut at = Vec::new();
    for _ in 0..3 {
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Idle).then_some(())
        })
        .await;
        at.push(tokio::time::Instant::now());
    }
    assert_eq!((at[1] - at[0]).as_secs(), 1, "{at:?}");
    shutdown.graceful();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_wake_ups_a_worker_polls_at_its_interval() {
    let store = Arc::new(Flaky {
        no_wakeups: true,
        ..Default::default()
    });
    let worker = Worker::new(store.clone(), Acts::default(), options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Idle).then_some(())
    })
    .await;
    let start = tokio::time::Instant::now();
    store.inner.enqueue(Task {
        id: 1,
        act: Act::Succeed,
    });
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    assert_eq!(
        start.elapsed(),
        options().interval,
        "found by the next poll"
    );
    shutdown.graceful();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_job_that_finishes_during_a_heartbeat_is_not_reported_lost() {
    let store = Arc::new(Flaky::default());
    *store.heartbeat_delay.lock().unwrap() = Duration::from_millis(300);
    store.inner.enqueue(Task {
        id: 1,
        // Finishes while the first heartbeat (sent at 500 ms) is in flight.
        act: Act::Sleep(Duration::from_millis(650)),
    });
    let mut o = options();
    o.num_total_jobs = Some(1);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let mut heartbeats = Vec::new();
    loop {
        match events.recv().await {
            Ok(WorkerEvent::Heartbeat { lost, .. }) => heartbeats.push(lost),
            Ok(WorkerEvent::Stopped) | Err(_) => break,
            Ok(_) => {}
        }
    }
    run.await.unwrap();
    assert_eq!(store.inner.state(1), Some(JobState::Completed));
    assert!(!heartbeats.is_empty(), "a heartbeat ran while the job did");
    assert!(heartbeats.iter().all(Vec::is_empty), "{heartbeats:?}");
}

#[tokio::test]
async fn a_handler_that_blocks_past_its_runtime_is_reported() {
    let store = store_with(&[]);
    store.enqueue(Task {
        id: 1,
        act: Act::Succeed,
    });
    struct Blocking;
    impl Handler<MemoryStore<Task>> for Blocking {
        async fn handle(
            &self,
            _job: &mut MemoryJob<Task>,
            _ctx: &JobContext<MemoryStore<Task>>,
        ) -> Result<(), HandlerError> {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        }
    }
    let mut o = options();
    o.num_total_jobs = Some(1);
    o.max_runtime_per_job = Some(Duration::from_millis(50));
    let worker = Worker::new(store.clone(), Blocking, o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let ran = wait_for(&mut events, |e| match e {
        WorkerEvent::Overran { id: 1, ran } => Some(*ran),
        _ => None,
    })
    .await;
    assert!(ran >= Duration::from_millis(200), "{ran:?}");
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_panic_inside_a_store_call_is_an_error_and_the_worker_goes_on() {
    // The conditions predicate runs inside the store's dequeue.
    struct PanickyFilter(AtomicBool);
    impl Handler<MemoryStore<Task>> for PanickyFilter {
        async fn pre_dequeue(&self) -> Result<Option<MemoryConditions<Task>>, BoxError> {
            if self.0.swap(false, Ordering::SeqCst) {
                return Ok(Some(MemoryConditions::filter(|_: &Task| {
                    panic!("scan exploded")
                })));
            }
            Ok(Some(MemoryConditions::default()))
        }
        async fn handle(
            &self,
            _job: &mut MemoryJob<Task>,
            _ctx: &JobContext<MemoryStore<Task>>,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }
    let store = store_with(&[Act::Succeed, Act::Succeed]);
    let mut o = options();
    o.num_total_jobs = Some(2);
    let worker = Worker::new(store.clone(), PanickyFilter(AtomicBool::new(true)), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let message = wait_for(&mut events, |e| match e {
        WorkerEvent::StoreFailed {
            op: "dequeue",
            message,
        } => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(message.contains("scan exploded"), "{message}");
    assert_eq!(run.await.unwrap().dequeued, 2);
    assert_eq!(store.count(JobState::Completed), 2);
}

/// A graceful shutdown that arrives while buffered jobs are being started
/// (each start awaits `pre_handle`) starts no more of them: they are handed
/// back.
#[tokio::test(start_paused = true)]
async fn a_shutdown_during_the_starts_of_buffered_jobs_starts_no_more() {
    struct StopsAtFirst {
        shutdown: Mutex<Option<workerutil::ShutdownHandle>>,
        started: AtomicUsize,
    }
    impl Handler<MemoryStore<Task>> for StopsAtFirst {
        async fn pre_handle(&self, _record: &Task) {
            if let Some(shutdown) = self.shutdown.lock().unwrap().take() {
                shutdown.graceful();
            }
        }
        async fn handle(
            &self,
            _job: &mut MemoryJob<Task>,
            _ctx: &JobContext<MemoryStore<Task>>,
        ) -> Result<(), HandlerError> {
            self.started.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let store = store_with(&[Act::Succeed; 5]);
    let handler = Arc::new(StopsAtFirst {
        shutdown: Mutex::new(None),
        started: AtomicUsize::new(0),
    });
    let mut o = options();
    o.num_handlers = 5;
    let worker = Worker::new(store.clone(), handler.clone(), o).unwrap();
    *handler.shutdown.lock().unwrap() = Some(worker.shutdown_handle());
    worker.run().await;
    assert_eq!(handler.started.load(Ordering::SeqCst), 1);
    assert_eq!(store.count(JobState::Completed), 1);
    assert_eq!(store.count(JobState::Queued), 4, "handed back");
}

/// A claim stuck in flight (a lock wait, a dead connection) holds a graceful
/// shutdown for at most the drain timeout, and an immediate one not at all.
#[tokio::test(start_paused = true)]
async fn a_claim_stuck_in_flight_holds_a_shutdown_no_longer_than_the_drain_timeout() {
    for immediate in [false, true] {
        let store = Arc::new(Flaky::default());
        *store.dequeue_delay.lock().unwrap() = Duration::from_secs(24 * 3600);
        store.enqueue_succeeding(1..=1);
        let mut o = options();
        o.drain_timeout = Duration::from_secs(5);
        let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
        let shutdown = worker.shutdown_handle();
        let run = tokio::spawn(worker.run());
        while store.dequeues.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let asked = tokio::time::Instant::now();
        if immediate {
            shutdown.immediate();
        } else {
            shutdown.graceful();
        }
        let summary = run.await.unwrap();
        let waited = asked.elapsed();
        let bound = if immediate {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        assert!(waited <= bound, "immediate: {immediate}: waited {waited:?}");
        assert_eq!(summary.dequeued, 0);
        assert_eq!(store.inner.state(1), Some(JobState::Queued));
    }
}

/// A job running past the drain timeout and a claim stuck in flight share
/// one drain timeout from the shutdown: the running job is cancelled when it
/// ends, not a drain timeout after the claim was given up (twice as late,
/// past an orchestrator's grace period set just above it).
#[tokio::test(start_paused = true)]
async fn a_stuck_claim_and_a_running_job_share_one_drain_timeout() {
    let store = Arc::new(Flaky::default());
    store.inner.enqueue(Task {
        id: 1,
        act: Act::Forever,
    });
    let mut o = options();
    o.num_handlers = 2;
    o.drain_timeout = Duration::from_secs(5);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    // The next claim (a free handler polls) hangs.
    *store.dequeue_delay.lock().unwrap() = Duration::from_secs(24 * 3600);
    while store.dequeues.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let asked = tokio::time::Instant::now();
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(
        asked.elapsed(),
        Duration::from_secs(5),
        "one drain timeout in all"
    );
    assert_eq!(store.inner.state(1), Some(JobState::Queued));
}

/// A job whose `open` waits (for a pool connection) is ended by a shutdown
/// like a buffered one: at once on an immediate one, after the drain timeout
/// on a graceful one, and put back, not failed.
#[tokio::test(start_paused = true)]
async fn a_job_waiting_to_open_is_requeued_by_a_shutdown_without_waiting_for_it() {
    for immediate in [false, true] {
        let store = Arc::new(Flaky::default());
        *store.open_delay.lock().unwrap() = Duration::from_secs(24 * 3600);
        store.enqueue_succeeding(1..=1);
        let mut o = options();
        o.drain_timeout = Duration::from_secs(5);
        let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
        let shutdown = worker.shutdown_handle();
        let mut events = worker.subscribe();
        let run = tokio::spawn(worker.run());
        wait_for(&mut events, |e| {
            matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
        })
        .await;
        let asked = tokio::time::Instant::now();
        if immediate {
            shutdown.immediate();
        } else {
            shutdown.graceful();
        }
        run.await.unwrap();
        let waited = asked.elapsed();
        let bound = if immediate {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        assert!(waited <= bound, "immediate: {immediate}: waited {waited:?}");
        let job = store.inner.snapshot(1).unwrap();
        assert_eq!(job.state, JobState::Queued, "immediate: {immediate}");
        assert_eq!(job.num_failures, 0, "immediate: {immediate}");
    }
}

/// `max_runtime` may panic (a kind read from a malformed row): that job
/// fails with the reason, its slot and lease are freed, and the others run.
#[tokio::test(start_paused = true)]
async fn a_panic_in_max_runtime_fails_that_job_and_the_worker_goes_on() {
    struct PanickyRuntime;
    impl Handler<MemoryStore<Task>> for PanickyRuntime {
        async fn handle(
            &self,
            _job: &mut MemoryJob<Task>,
            _ctx: &JobContext<MemoryStore<Task>>,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
        fn max_runtime(&self, record: &Task) -> Option<Duration> {
            assert_ne!(record.id, 1, "no kind in row 1");
            None
        }
    }
    let store = store_with(&[Act::Succeed, Act::Succeed]);
    let mut o = options();
    o.num_total_jobs = Some(2);
    o.num_handlers = 1;
    let summary = Worker::new(store.clone(), PanickyRuntime, o)
        .unwrap()
        .run()
        .await;
    assert_eq!(summary.dequeued, 2);
    let failed = store.snapshot(1).unwrap();
    assert_eq!(failed.state, JobState::Failed);
    assert!(
        failed
            .failure_message
            .as_deref()
            .is_some_and(|m| m.contains("max_runtime panicked") && m.contains("no kind in row 1")),
        "{:?}",
        failed.failure_message
    );
    assert_eq!(store.state(2), Some(JobState::Completed));
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_errors_because_of_a_shutdown_is_requeued_not_failed() {
    struct GivesUp;
    impl Handler<MemoryStore<Task>> for GivesUp {
        async fn handle(
            &self,
            _job: &mut MemoryJob<Task>,
            ctx: &JobContext<MemoryStore<Task>>,
        ) -> Result<(), HandlerError> {
            ctx.cancellation().cancelled().await;
            Err(HandlerError::non_retryable("stopped early"))
        }
    }
    let store = store_with(&[Act::Succeed]);
    let worker = Worker::new(store.clone(), GivesUp, options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 1 }).then_some(())
    })
    .await;
    shutdown.immediate();
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(outcome, Outcome::Interrupted), "{outcome:?}");
    assert!(marked);
    run.await.unwrap();
    let snapshot = store.snapshot(1).unwrap();
    assert_eq!(snapshot.state, JobState::Queued);
    assert_eq!(snapshot.num_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_slow_mark_does_not_hold_the_handler_slot() {
    let store = Arc::new(Flaky::default());
    *store.mark_delay.lock().unwrap() = Duration::from_secs(10);
    store.enqueue_succeeding(1..=2);
    let mut o = options();
    o.num_handlers = 1;
    o.num_total_jobs = Some(2);
    let worker = Worker::new(store.clone(), Acts::default(), o).unwrap();
    let mut events = worker.subscribe();
    let start = tokio::time::Instant::now();
    let run = tokio::spawn(worker.run());
    // Job 2 starts while job 1's outcome is still being written.
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: 2 }).then_some(())
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    run.await.unwrap();
    assert_eq!(store.inner.count(JobState::Completed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_busy_queue_is_claimed_by_two_dequeues_at_once_an_idle_one_by_one() {
    // (jobs, concurrent_dequeues, most dequeues seen at once)
    for (jobs, setting, expected) in [(400_usize, None, 2), (400, Some(1), 1), (3, None, 1)] {
        let store = Arc::new(Flaky::default());
        *store.dequeue_delay.lock().unwrap() = Duration::from_millis(20);
        for id in 1..=jobs {
            store.inner.enqueue(Task {
                id: i64::try_from(id).unwrap(),
                act: Act::Sleep(Duration::from_millis(5)),
            });
        }
        let mut o = options();
        o.num_handlers = 8;
        // A fixed allowance: the shares below are of a fixed capacity (the
        // adaptive one has its own test).
        o.claim_ahead = Some(8);
        o.num_total_jobs = Some(jobs as u64);
        o.concurrent_dequeues = setting;
        let summary = Worker::new(store.clone(), Acts::default(), o)
            .unwrap()
            .run()
            .await;
        assert_eq!(summary.dequeued, jobs as u64, "{setting:?}");
        assert_eq!(store.inner.count(JobState::Completed), jobs);
        assert_eq!(
            store.max_dequeues.load(Ordering::SeqCst),
            expected,
            "{jobs} jobs, {setting:?}"
        );
        // Room is reserved per claim: the claims in flight never ask for more
        // than the handlers and the claim-ahead buffer hold together.
        let limits = store.limits.lock().unwrap().clone();
        assert!(limits.iter().all(|l| *l <= 16), "{limits:?}");
        if expected == 2 {
            // The first claim fills everything; while the queue stays busy each
            // claim takes its share (half), so two can be in flight at once.
            assert_eq!(limits[0], 16, "{limits:?}");
            assert!(limits[1..].iter().all(|l| *l <= 8), "{limits:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_claim_ahead_grows_for_fast_jobs_within_its_bound() {
    // (jobs' run time, max_claim_ahead, the largest claim allowed, whether
    // claims must grow past the old fixed capacity of 16)
    for (run, bound, most, grows) in [
        (
            Duration::from_micros(100),
            None,
            8 + DEFAULT_MAX_CLAIM_AHEAD,
            true,
        ),
        (Duration::from_micros(100), Some(4), 8 + 4, false),
        (
            Duration::from_millis(500),
            None,
            8 + DEFAULT_MAX_CLAIM_AHEAD,
            false,
        ),
    ] {
        let store = Arc::new(Flaky::default());
        *store.dequeue_delay.lock().unwrap() = Duration::from_millis(20);
        for id in 1..=600 {
            store.inner.enqueue(Task {
                id,
                act: Act::Sleep(run),
            });
        }
        let mut o = options();
        o.num_handlers = 8;
        o.max_claim_ahead = bound;
        o.num_total_jobs = Some(600);
        let summary = Worker::new(store.clone(), Acts::default(), o)
            .unwrap()
            .run()
            .await;
        assert_eq!(summary.dequeued, 600);
        assert_eq!(store.inner.count(JobState::Completed), 600);
        let limits = store.limits.lock().unwrap().clone();
        let largest = limits.iter().copied().max().unwrap_or(0);
        assert!(largest <= most, "{run:?} {bound:?}: {limits:?}");
        if grows {
            assert!(largest > 16, "fast jobs, bigger claims: {limits:?}");
        }
        if run >= Duration::from_millis(500) {
            // Slow jobs: after the first claims the buffer shrinks to one
            // job beyond the free handlers.
            let late = &limits[limits.len() / 2..];
            assert!(late.iter().all(|l| *l <= 8 + 1), "slow jobs: {limits:?}");
        }
    }
    // A store that suggests no claim-ahead gets none, fast jobs or not.
    let store = Arc::new(Flaky {
        no_claim_ahead: true,
        ..Flaky::default()
    });
    *store.dequeue_delay.lock().unwrap() = Duration::from_millis(20);
    for id in 1..=200 {
        store.inner.enqueue(Task {
            id,
            act: Act::Sleep(Duration::from_micros(100)),
        });
    }
    let mut o = options();
    o.num_handlers = 8;
    o.num_total_jobs = Some(200);
    Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run()
        .await;
    let limits = store.limits.lock().unwrap().clone();
    assert!(limits.iter().all(|l| *l <= 8), "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn a_job_lost_before_it_opens_never_runs_and_one_that_cannot_open_goes_back() {
    let store = Arc::new(Flaky {
        inner: MemoryStore::new({
            let mut o = MemoryStoreOptions::default();
            o.max_num_resets = 5;
            o
        }),
        ..Default::default()
    });
    store.enqueue_succeeding(1..=3);
    // Job 1 is reset between its claim and its open; job 2's open fails.
    *store.reset_before_open.lock().unwrap() = Some(1);
    *store.fail_open.lock().unwrap() = Some(2);
    let mut o = options();
    o.num_handlers = 3;
    o.num_total_jobs = Some(3);
    let acts = Arc::new(Acts::default());
    let worker = Worker::new(store.clone(), acts.clone(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let (lost, lost_marked) = wait_for(&mut events, finished(1)).await;
    let (failed_open, reopened) = wait_for(&mut events, finished(2)).await;
    let (done, _) = wait_for(&mut events, finished(3)).await;
    run.await.unwrap();

    assert!(matches!(lost, Outcome::Lost), "{lost:?}");
    assert!(!lost_marked, "a job another claim may own is not written");
    assert!(
        matches!(failed_open, Outcome::Interrupted),
        "{failed_open:?}"
    );
    assert!(reopened, "a job that could not open is handed back");
    assert!(matches!(done, Outcome::Completed), "{done:?}");
    // Neither of the first two ran its handler; both wait to be claimed again,
    // neither charged a failure.
    assert_eq!(*acts.handled.lock().unwrap(), [3]);
    for id in [1, 2] {
        assert_eq!(store.inner.state(id), Some(JobState::Queued), "job {id}");
        assert_eq!(store.inner.snapshot(id).map(|s| s.num_failures), Some(0));
    }
    assert_eq!(store.inner.state(3), Some(JobState::Completed));
}

#[tokio::test(start_paused = true)]
async fn after_a_short_claim_live_wake_ups_replace_the_next_claim() {
    // (store without wake-ups, claims within half an interval of the finds)
    for (no_wakeups, expected) in [(false, 1), (true, 2)] {
        let store = Arc::new(Flaky {
            no_wakeups,
            ..Default::default()
        });
        store.enqueue_succeeding(1..=3);
        let mut o = options();
        o.num_handlers = 8;
        let worker = Worker::new(store.clone(), Acts::default(), o.clone()).unwrap();
        let mut events = worker.subscribe();
        let shutdown = worker.shutdown_handle();
        let run = tokio::spawn(worker.run());
        for id in 1..=3 {
            wait_for(&mut events, finished(id)).await;
        }
        tokio::time::sleep(o.interval / 2).await;
        // The claim came back short (3 of 16): the queue is drained. Polling
        // looks again at once; with wake-ups a new job announces itself.
        let claims = store.limits.lock().unwrap().len();
        assert_eq!(claims, expected, "no_wakeups: {no_wakeups}");
        if !no_wakeups {
            store.inner.enqueue(Task {
                id: 4,
                act: Act::Succeed,
            });
            let before = tokio::time::Instant::now();
            wait_for(&mut events, finished(4)).await;
            assert_eq!(tokio::time::Instant::now(), before, "woken at once");
        }
        shutdown.graceful();
        run.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn run_until_empty_returns_once_nothing_is_runnable_and_every_job_finished() {
    // Retries come due at once, so they are runnable work too.
    let store = Arc::new(MemoryStore::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 2;
        o.retry_after = Duration::ZERO;
        o
    }));
    for id in 1..=30 {
        store.enqueue(Task {
            id,
            act: if id == 7 {
                Act::Retryable
            } else {
                Act::Sleep(Duration::from_millis(5 * (id as u64 % 4)))
            },
        });
    }
    let mut o = options();
    o.num_handlers = 4;
    let summary = Worker::new(store.clone(), Acts::default(), o)
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(summary.reason, StopReason::QueueEmpty);
    assert_eq!(summary.dequeued, 29 + 3, "job 7 ran three times");
    assert_eq!(store.count(JobState::Completed), 29);
    assert_eq!(store.count(JobState::Failed), 1);
    assert_eq!(
        store.count(JobState::Queued) + store.count(JobState::Errored),
        0
    );

    // An empty queue: the first claim finds nothing and it returns at once.
    let empty = Arc::new(MemoryStore::<Task>::new(MemoryStoreOptions::default()));
    let started = tokio::time::Instant::now();
    let summary = Worker::new(empty, Acts::default(), options())
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(summary.reason, StopReason::QueueEmpty);
    assert_eq!(summary.dequeued, 0);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn run_until_empty_waits_for_a_retry_whose_mark_is_still_being_written() {
    // The empty claim comes back while the first attempt's errored mark is
    // still on its way; the retry it makes runnable must still run.
    let store = Arc::new(Flaky {
        inner: MemoryStore::new({
            let mut o = MemoryStoreOptions::default();
            o.max_num_retries = 1;
            o.retry_after = Duration::ZERO;
            o
        }),
        errored_mark_delay: Mutex::new(Duration::from_millis(200)),
        ..Default::default()
    });
    store.inner.enqueue(Task {
        id: 1,
        act: Act::Retryable,
    });
    let summary = Worker::new(store.clone(), Acts::default(), options())
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(summary.reason, StopReason::QueueEmpty);
    assert_eq!(summary.dequeued, 2, "the retry ran too");
    assert_eq!(store.inner.count(JobState::Failed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_completion_the_store_refuses_is_recorded_and_reported_as_an_error() {
    for wrap_refusal in [false, true] {
        refused_completion(wrap_refusal).await;
    }
}

async fn refused_completion(wrap_refusal: bool) {
    let store = Arc::new(Flaky {
        inner: MemoryStore::new({
            let mut o = MemoryStoreOptions::default();
            o.max_num_retries = 3;
            o.retry_after = Duration::from_secs(3600);
            o
        }),
        wrap_refusal,
        ..Flaky::default()
    });
    store.enqueue_succeeding(1..=2);
    *store.refuse_completion.lock().unwrap() = Some(1);
    let acts = Arc::new(Acts::default());
    let mut o = options();
    o.num_total_jobs = Some(2);
    let worker = Worker::new(store.clone(), acts.clone(), o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let (outcome, marked) = wait_for(&mut events, finished(1)).await;
    run.await.unwrap();
    match outcome {
        Outcome::Errored(cause) => assert!(cause.to_string().contains("deferred"), "{cause}"),
        other => panic!("reported {other:?}"),
    }
    assert!(marked, "the errored mark was written");
    let snapshot = store.inner.snapshot(1).unwrap();
    assert_eq!(snapshot.state, JobState::Errored);
    assert_eq!(snapshot.num_failures, 1);
    assert!(
        snapshot
            .failure_message
            .as_deref()
            .is_some_and(|m| m.contains("deferred")),
        "{:?}",
        snapshot.failure_message
    );
    // The hook saw what was recorded; the other job completed as usual.
    let mut post = acts.post_handled.lock().unwrap().clone();
    post.sort();
    assert_eq!(post, [(1, "errored"), (2, "completed")]);
    assert_eq!(store.inner.state(2), Some(JobState::Completed));
}
