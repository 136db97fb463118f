//! A finished job whose outcome is slow to write stays heartbeated until its
//! mark lands, so a resetter never takes it for stalled (on tokio's paused
//! clock, with a resetter modelled on the Postgres store's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use workerutil::testing::{finished, wait_for};
use workerutil::{
    BoxError, Handler, HandlerError, HeartbeatResult, JobContext, JobState, Lease,
    MemoryConditions, MemoryJob, MemoryStore, Record, RecordId, Store, Worker, WorkerEvent,
    WorkerOptions,
};

#[derive(Debug, Clone)]
struct Task(RecordId);

impl Record for Task {
    fn id(&self) -> RecordId {
        self.0
    }
}

/// The in-memory store with a slow `mark_complete`, a log of heartbeats, and
/// a stalled-job resetter: a processing job no beat touched for
/// `stalled_max_age` (since its claim or its last beat) is reset, as the
/// Postgres resetter does by `last_heartbeat_at`.
struct Stalling {
    // `max_num_resets` 0: one reset fails the job ("died too many times").
    inner: MemoryStore<Task>,
    mark_delay: Duration,
    /// When each heartbeat read the store, and the ids it asked about.
    beats: Mutex<Vec<(Instant, Vec<RecordId>)>>,
    /// When each processing job was last claimed or beaten (owned).
    touched: Mutex<HashMap<RecordId, Instant>>,
    /// When the first mark started and ended.
    mark: Mutex<(Option<Instant>, Option<Instant>)>,
    resets: Mutex<Vec<RecordId>>,
}

impl Stalling {
    fn new(mark_delay: Duration) -> Self {
        Stalling {
            inner: MemoryStore::default(),
            mark_delay,
            beats: Mutex::default(),
            touched: Mutex::default(),
            mark: Mutex::default(),
            resets: Mutex::default(),
        }
    }

    /// One round of the resetter.
    fn reset_stalled(&self, stalled_max_age: Duration) {
        let mut touched = self.touched.lock().unwrap();
        touched.retain(|id, at| {
            if self.inner.state(*id) != Some(JobState::Processing) {
                return false;
            }
            if at.elapsed() < stalled_max_age {
                return true;
            }
            self.inner.reset(*id);
            self.resets.lock().unwrap().push(*id);
            false
        });
    }
}

impl Store for Stalling {
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
        let jobs = self.inner.dequeue(host, c, limit).await?;
        let mut touched = self.touched.lock().unwrap();
        for job in &jobs {
            touched.insert(workerutil::Job::lease(job).id, Instant::now());
        }
        Ok(jobs)
    }
    async fn heartbeat(&self, leases: &[Lease]) -> Result<HeartbeatResult, BoxError> {
        let ids = leases.iter().map(|l| l.id).collect();
        self.beats.lock().unwrap().push((Instant::now(), ids));
        // Fenced by state and token, like the Postgres beat.
        let result = self.inner.heartbeat(leases).await?;
        let mut touched = self.touched.lock().unwrap();
        for id in &result.known {
            touched.insert(*id, Instant::now());
        }
        Ok(result)
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
        self.mark.lock().unwrap().0.get_or_insert_with(Instant::now);
        tokio::time::sleep(self.mark_delay).await;
        let marked = self.inner.mark_complete(job).await;
        self.mark.lock().unwrap().1.get_or_insert_with(Instant::now);
        marked
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

/// Completes every job at once.
struct Succeeds;
impl Handler<Stalling> for Succeeds {
    async fn handle(
        &self,
        _job: &mut MemoryJob<Task>,
        _ctx: &JobContext<Stalling>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

const HEARTBEAT: Duration = Duration::from_millis(500);
const STALLED_MAX_AGE: Duration = Duration::from_secs(2);
const MARK: Duration = Duration::from_millis(4_700);

/// Runs one job whose completion takes `MARK` (over nine heartbeat
/// intervals, more than twice the stalled age) while a resetter checks for
/// stalled jobs every 100 ms; returns the store and the beats' lost lists.
async fn run_one_slow_mark() -> (Arc<Stalling>, Vec<Vec<RecordId>>) {
    let store = Arc::new(Stalling::new(MARK));
    store.inner.enqueue(Task(1));
    let mut o = WorkerOptions::new("slow-mark");
    o.hostname = Some("test-host".into());
    o.interval = Duration::from_millis(100);
    o.heartbeat_interval = HEARTBEAT;
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    o.num_total_jobs = Some(1);
    o.event_capacity = 1024;
    let worker = Worker::new(store.clone(), Succeeds, o).unwrap();
    let mut events = worker.subscribe();
    let resetter = tokio::spawn({
        let store = store.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                store.reset_stalled(STALLED_MAX_AGE);
            }
        }
    });
    let run = tokio::spawn(worker.run());
    let mut lost = Vec::new();
    loop {
        match events.recv().await {
            Ok(WorkerEvent::Heartbeat { lost: l, .. }) => lost.push(l),
            Ok(WorkerEvent::Stopped) | Err(_) => break,
            Ok(_) => {}
        }
    }
    run.await.unwrap();
    resetter.abort();
    (store, lost)
}

#[tokio::test(start_paused = true)]
async fn a_slow_mark_keeps_its_lease_heartbeated_and_the_job_is_not_reset() {
    let (store, lost) = run_one_slow_mark().await;
    let job = store.inner.snapshot(1).unwrap();
    assert_eq!(
        (job.state, store.resets.lock().unwrap().len()),
        (JobState::Completed, 0),
        "{:?}",
        job.failure_message
    );
    let (start, end) = *store.mark.lock().unwrap();
    let (start, end) = (start.unwrap(), end.unwrap());
    assert!(end - start >= MARK, "{:?}", end - start);
    let during: Vec<Instant> = store
        .beats
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, ids)| *at >= start && *at < end && ids.contains(&1))
        .map(|(at, _)| *at)
        .collect();
    // One beat per interval while the mark waits (nine in 4.7 s at 500 ms).
    assert!(during.len() >= 8, "{} beats during the mark", during.len());
    // The beat after the mark no longer matched the lease: not lost.
    assert!(lost.iter().all(Vec::is_empty), "{lost:?}");
}

#[tokio::test(start_paused = true)]
async fn a_recorded_job_is_beaten_no_more() {
    let store = Arc::new(Stalling::new(MARK));
    store.inner.enqueue(Task(1));
    let mut o = WorkerOptions::new("slow-mark");
    o.hostname = Some("test-host".into());
    o.heartbeat_interval = HEARTBEAT;
    let worker = Worker::new(store.clone(), Succeeds, o).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, finished(1)).await;
    // Several intervals with the worker idle: the lease left with its mark.
    tokio::time::sleep(HEARTBEAT * 6).await;
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(store.inner.state(1), Some(JobState::Completed));
    let end = store.mark.lock().unwrap().1.unwrap();
    let beats = store.beats.lock().unwrap();
    assert!(beats.iter().any(|(at, _)| *at < end), "{beats:?}");
    assert!(beats.iter().all(|(at, _)| *at < end), "{beats:?}");
}
