//! A store that hands a job back while opening it (a pause met by a job
//! claimed ahead) answers `Withheld`, and the worker reports that, even when
//! a heartbeat runs meanwhile and no longer finds the job (on the in-memory
//! store and tokio's paused clock).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use workerutil::testing::{finished, wait_for};
use workerutil::{
    BoxError, Handler, HandlerError, HeartbeatResult, JobContext, JobState, Lease,
    MemoryConditions, MemoryJob, MemoryStore, Outcome, Record, RecordId, Store, Worker,
    WorkerOptions,
};

#[derive(Debug, Clone)]
struct Task(RecordId);

impl Record for Task {
    fn id(&self) -> RecordId {
        self.0
    }
}

const HEARTBEAT: Duration = Duration::from_millis(100);

/// The in-memory store whose first open puts the job back in the queue,
/// then answers only after several heartbeats (a slow round trip, or a
/// beat that waited on the row's lock), as the Postgres store's look for a
/// pause does.
#[derive(Default)]
struct HandsBack {
    inner: MemoryStore<Task>,
    handed_back: AtomicBool,
    /// Answers "ours" after all, as an open that checks nothing does (a
    /// heartbeat-mode open whose job was reset and claimed elsewhere
    /// meanwhile): the job is no longer this worker's.
    then_ours: bool,
}

impl Store for HandsBack {
    type Record = Task;
    type Job = MemoryJob<Task>;
    type Conditions = MemoryConditions<Task>;

    async fn queued_count(&self) -> Result<u64, BoxError> {
        self.inner.queued_count().await
    }
    async fn dequeue(
        &self,
        host: &str,
        c: &Self::Conditions,
        limit: usize,
    ) -> Result<Vec<Self::Job>, BoxError> {
        self.inner.dequeue(host, c, limit).await
    }
    async fn open(&self, job: &mut Self::Job) -> Result<bool, BoxError> {
        if self.handed_back.swap(true, Ordering::SeqCst) {
            return self.inner.open(job).await;
        }
        assert!(self.inner.requeue(job).await?, "put back");
        tokio::time::sleep(HEARTBEAT * 4).await;
        if self.then_ours {
            return Ok(true);
        }
        Err(Box::new(workerutil::Error::Withheld("paused".into())))
    }
    async fn heartbeat(&self, leases: &[Lease]) -> Result<HeartbeatResult, BoxError> {
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
        self.inner.mark_complete(job).await
    }
    async fn mark_errored(
        &self,
        job: &mut Self::Job,
        m: &str,
        retry: Option<&workerutil::Retry>,
    ) -> Result<Option<JobState>, BoxError> {
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

/// Completes, counting the jobs it started.
#[derive(Default)]
struct Completes(std::sync::atomic::AtomicUsize);
impl Handler<HandsBack> for Completes {
    async fn handle(
        &self,
        _job: &mut MemoryJob<Task>,
        _ctx: &JobContext<HandsBack>,
    ) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn options() -> WorkerOptions {
    let mut o = WorkerOptions::new("withheld");
    o.hostname = Some("host".into());
    o.interval = Duration::from_millis(50);
    o.heartbeat_interval = HEARTBEAT;
    // Not claimed again while its open runs (a paused queue's job is not).
    o.num_handlers = 1;
    o.claim_ahead = Some(0);
    o
}

/// The heartbeats during the open no longer find the job (it is queued
/// again): they must not cancel it as lost, or the worker reports `Lost`
/// for a job the store withheld.
#[tokio::test(start_paused = true)]
async fn a_job_its_open_hands_back_is_reported_withheld_though_heartbeats_lost_it() {
    let store = Arc::new(HandsBack::default());
    store.inner.enqueue(Task(1));
    let worker = Worker::new(store.clone(), Completes::default(), options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    let (first, _) = wait_for(&mut events, finished(1)).await;
    assert!(
        matches!(&first, Outcome::Withheld(reason) if reason == "paused"),
        "{first:?}"
    );
    // Back in the queue, it runs at the next claim.
    let (second, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(second, Outcome::Completed) && marked, "{second:?}");
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(store.inner.state(1), Some(JobState::Completed));
}

/// The heartbeats during the open no longer find the job, and the open
/// answers "ours" all the same (it checks nothing): the job must not start,
/// for another worker may run it now. Reported `Lost`; run once, at its
/// next claim.
#[tokio::test(start_paused = true)]
async fn a_job_lost_while_its_open_runs_is_not_started_though_the_open_says_ours() {
    let store = Arc::new(HandsBack {
        then_ours: true,
        ..HandsBack::default()
    });
    store.inner.enqueue(Task(1));
    let handler = Arc::new(Completes::default());
    let worker = Worker::new(store.clone(), handler.clone(), options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    let (first, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(first, Outcome::Lost) && !marked, "{first:?}");
    let (second, marked) = wait_for(&mut events, finished(1)).await;
    assert!(matches!(second, Outcome::Completed) && marked, "{second:?}");
    // Only the second claim ran it: the lost attempt never started.
    assert_eq!(
        handler.0.load(Ordering::SeqCst),
        1,
        "the lost job was started"
    );
    shutdown.graceful();
    run.await.unwrap();
}
