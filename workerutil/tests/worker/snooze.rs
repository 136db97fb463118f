//! A handler's snooze on the in-memory store and tokio's paused clock: the job
//! goes back to the queue, waits out its delay, runs again, and no failure is
//! counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use workerutil::{
    Handler, HandlerError, JobContext, JobState, MemoryJob, MemoryStore, MemoryStoreOptions,
    Outcome, Record, RecordId, Worker, WorkerOptions,
};

#[derive(Debug, Clone)]
struct Task(RecordId);

impl Record for Task {
    fn id(&self) -> RecordId {
        self.0
    }
}

/// Snoozes the first attempt for 5 s; records when each attempt started and
/// what post_handle saw.
#[derive(Default)]
struct SnoozeOnce {
    attempts: AtomicUsize,
    started: std::sync::Mutex<Vec<tokio::time::Instant>>,
    outcomes: std::sync::Mutex<Vec<String>>,
}
impl Handler<MemoryStore<Task>> for SnoozeOnce {
    async fn handle(
        &self,
        _job: &mut MemoryJob<Task>,
        _ctx: &JobContext<MemoryStore<Task>>,
    ) -> Result<(), HandlerError> {
        self.started
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::snooze(Duration::from_secs(5)));
        }
        Ok(())
    }

    async fn post_handle(&self, _record: &Task, outcome: &Outcome) {
        self.outcomes
            .lock()
            .unwrap()
            .push(outcome.kind().to_owned());
    }
}

#[tokio::test(start_paused = true)]
async fn a_snoozed_job_runs_again_after_its_delay_without_a_failure() {
    let store = Arc::new(MemoryStore::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 0;
        o
    }));
    store.enqueue(Task(1));
    let handler = Arc::new(SnoozeOnce::default());
    let mut o = WorkerOptions::new("snooze");
    o.hostname = Some("host".into());
    o.num_total_jobs = Some(2);
    o.interval = Duration::from_millis(100);
    Worker::new(store.clone(), handler.clone(), o)
        .unwrap()
        .run()
        .await;
    let started = handler.started.lock().unwrap().clone();
    assert_eq!(started.len(), 2, "ran twice");
    let waited = started[1] - started[0];
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
        "the second attempt waited out the snooze: {waited:?}"
    );
    assert_eq!(*handler.outcomes.lock().unwrap(), ["snoozed", "completed"]);
    let snapshot = store.snapshot(1).unwrap();
    assert_eq!(snapshot.state, JobState::Completed);
    // No retries were allowed: a snooze counted as a failure would have failed it.
    assert_eq!(snapshot.num_failures, 0);
}
