//! `KindRegistry` over the in-memory store: dispatch by kind, unknown kinds
//! failed with a clear message, dequeues restricted to registered kinds, and
//! outcomes counted per kind.

use std::sync::{Arc, Mutex};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use workerutil::{
    Handler, HandlerError, JobContext, JobState, KindRegistry, MemoryConditions, MemoryJob,
    MemoryStore, Outcome, Record, Worker, WorkerOptions,
};

#[derive(Debug, Clone)]
struct Task {
    id: i64,
    kind: &'static str,
}

impl Record for Task {
    fn id(&self) -> i64 {
        self.id
    }
}

type Store = MemoryStore<Task>;

/// Records which handler ran which job, and which post_handle saw it.
#[derive(Clone)]
struct Named {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
}
impl Handler<Store> for Named {
    async fn handle(
        &self,
        job: &mut MemoryJob<Task>,
        _ctx: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        let line = format!("{} ran {}", self.name, job.record.id);
        self.log.lock().unwrap().push(line);
        Ok(())
    }

    async fn post_handle(&self, record: &Task, outcome: &Outcome) {
        let line = format!("{} saw {} {}", self.name, record.id, outcome.kind());
        self.log.lock().unwrap().push(line);
    }
}

fn store(tasks: &[(i64, &'static str)]) -> Arc<Store> {
    let store = Arc::new(Store::default());
    for &(id, kind) in tasks {
        store.enqueue(Task { id, kind });
    }
    store
}

fn options(jobs: u64) -> WorkerOptions {
    let mut o = WorkerOptions::new("kinds");
    o.hostname = Some("host".into());
    o.num_total_jobs = Some(jobs);
    o
}

fn registry(log: &Arc<Mutex<Vec<String>>>) -> KindRegistry<Store> {
    let named = |name| Named {
        name,
        log: log.clone(),
    };
    KindRegistry::new(|t: &Task| t.kind)
        .register("email", named("mailer"))
        .unwrap()
        .register("report", named("reporter"))
        .unwrap()
}

/// Runs `work` to its end on a current-thread runtime with tokio's clock
/// paused, recording metrics into `recorder`.
fn on_paused_runtime<T>(recorder: &DebuggingRecorder, work: impl Future<Output = T>) -> T {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(work)
    })
}

/// `kind/outcome=n` for each series of the jobs-by-kind counter, sorted.
fn counted_by_kind(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<String> {
    let mut counted = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() == workerutil::metrics::JOBS_BY_KIND_TOTAL
            && let DebugValue::Counter(n) = value
        {
            let labels: Vec<String> = key.key().labels().map(|l| l.value().to_owned()).collect();
            counted.push(format!("{}={n}", labels.join("/")));
        }
    }
    counted.sort();
    counted
}

#[test]
fn each_kind_goes_to_its_handler_and_an_unknown_kind_fails_clearly() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let log = Arc::new(Mutex::new(Vec::new()));
    let store = store(&[(1, "email"), (2, "report"), (3, "fax")]);
    on_paused_runtime(&recorder, async {
        let worker = Worker::new(store.clone(), registry(&log), options(3)).unwrap();
        worker.run().await;
    });
    let mut lines = log.lock().unwrap().clone();
    lines.sort();
    assert_eq!(
        lines,
        [
            "mailer ran 1",
            "mailer saw 1 completed",
            "reporter ran 2",
            "reporter saw 2 completed"
        ]
    );
    assert_eq!(store.state(3), Some(JobState::Failed));
    let message = store.snapshot(3).unwrap().failure_message.unwrap();
    assert_eq!(
        message,
        "no handler is registered for kind \"fax\" (registered: email, report)"
    );

    let counted = counted_by_kind(&snapshotter);
    assert_eq!(counted, ["email/ok=1", "fax/poison=1", "report/ok=1"]);
}

/// Fails with a retryable error, or a non-retryable one.
struct Fails {
    retryable: bool,
}
impl Handler<Store> for Fails {
    async fn handle(
        &self,
        _: &mut MemoryJob<Task>,
        _: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        Err(match self.retryable {
            true => HandlerError::retryable("the mail server is down"),
            false => HandlerError::non_retryable("the template is missing"),
        })
    }
}

/// Seed 002's outcome labels: a retryable error with retries left is a
/// `retry`, the same error with none left a `failed`, a non-retryable one a
/// `poison`, a success an `ok`: told apart by the state the store wrote.
#[test]
fn outcomes_by_kind_tell_a_retry_from_a_final_failure_from_a_poison_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut mo = workerutil::MemoryStoreOptions::default();
    mo.max_num_retries = 1;
    let store = Arc::new(Store::new(mo));
    for (id, kind) in [(1, "email"), (2, "report"), (3, "sms")] {
        store.enqueue(Task { id, kind });
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    on_paused_runtime(&recorder, async {
        let registry = KindRegistry::new(|t: &Task| t.kind)
            .register("email", Fails { retryable: true })
            .unwrap()
            .register("report", Fails { retryable: false })
            .unwrap()
            .register(
                "sms",
                Named {
                    name: "texter",
                    log: log.clone(),
                },
            )
            .unwrap();
        // Two attempts of the email (one retry), one of each other.
        let worker = Worker::new(store.clone(), registry, options(4)).unwrap();
        worker.run().await;
    });
    assert_eq!(store.state(1), Some(JobState::Failed));
    assert_eq!(store.state(2), Some(JobState::Failed));
    let counted = counted_by_kind(&snapshotter);
    assert_eq!(
        counted,
        [
            "email/failed=1",
            "email/retry=1",
            "report/poison=1",
            "sms/ok=1"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_restricted_registry_claims_only_its_kinds() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let store = store(&[(1, "email"), (2, "fax"), (3, "report"), (4, "fax")]);
    let registry = registry(&log).restrict_dequeue(|kinds| {
        let kinds = kinds.to_vec();
        MemoryConditions::filter(move |t: &Task| kinds.iter().any(|k| k == t.kind))
    });
    Worker::new(store.clone(), registry, options(2))
        .unwrap()
        .run()
        .await;
    assert_eq!(store.count(JobState::Completed), 2);
    // Left for a worker that handles them, not failed.
    assert_eq!(store.state(2), Some(JobState::Queued));
    assert_eq!(store.state(4), Some(JobState::Queued));
}

/// Sleeps, then succeeds.
struct Sleeps(std::time::Duration);
impl Handler<Store> for Sleeps {
    async fn handle(
        &self,
        _job: &mut MemoryJob<Task>,
        _ctx: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_kind_may_set_its_own_maximum_runtime() {
    use std::time::Duration;
    use workerutil::KindOptions;
    // The worker lets jobs run 2 s; "export" jobs only 50 ms.
    let store = store(&[(1, "export"), (2, "email"), (3, "export")]);
    let registry = KindRegistry::new(|t: &Task| t.kind)
        .register_with(
            "export",
            Sleeps(Duration::from_millis(300)),
            KindOptions::max_runtime(Duration::from_millis(50)),
        )
        .unwrap()
        .register("email", Sleeps(Duration::from_millis(300)))
        .unwrap();
    let mut o = options(3);
    o.max_runtime_per_job = Some(Duration::from_secs(2));
    let summary = Worker::new(store.clone(), registry, o).unwrap().run().await;
    assert_eq!(summary.dequeued, 3);
    assert_eq!(
        store.state(2),
        Some(JobState::Completed),
        "the worker's 2 s"
    );
    for id in [1, 3] {
        assert_ne!(
            store.state(id),
            Some(JobState::Completed),
            "export {id} timed out"
        );
    }
    let failure = store
        .snapshot(1)
        .and_then(|s| s.failure_message)
        .unwrap_or_default();
    assert!(failure.contains("50ms"), "{failure}");
}

#[tokio::test(start_paused = true)]
async fn a_kind_may_opt_out_of_the_workers_timeout() {
    use std::time::Duration;
    use workerutil::KindOptions;
    // The worker lets jobs run 50 ms; "import" jobs as long as they take.
    let store = store(&[(1, "import"), (2, "email")]);
    let registry = KindRegistry::new(|t: &Task| t.kind)
        .register_with(
            "import",
            Sleeps(Duration::from_secs(3600)),
            KindOptions::no_timeout(),
        )
        .unwrap()
        .register("email", Sleeps(Duration::from_secs(3600)))
        .unwrap();
    let mut o = options(2);
    o.max_runtime_per_job = Some(Duration::from_millis(50));
    let summary = Worker::new(store.clone(), registry, o).unwrap().run().await;
    assert_eq!(summary.dequeued, 2);
    assert_eq!(
        store.state(1),
        Some(JobState::Completed),
        "the import ran its hour"
    );
    assert_ne!(
        store.state(2),
        Some(JobState::Completed),
        "the email timed out"
    );
}

/// The series of `name` as `labels=value` lines, sorted.
fn series(
    snapshot: metrics_util::debugging::Snapshot,
    name: &str,
    show: impl Fn(&DebugValue) -> String,
) -> Vec<String> {
    let mut lines: Vec<String> = snapshot
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(key, _, _, value)| {
            let labels: Vec<&str> = key.key().labels().map(|l| l.value()).collect();
            format!("{}={}", labels.join("/"), show(&value))
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn each_kind_has_its_own_duration_histogram_and_in_flight_gauge() {
    use workerutil::metrics::{IN_FLIGHT_BY_KIND, JOB_DURATION_BY_KIND_SECONDS};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauge = |v: &DebugValue| match v {
        DebugValue::Gauge(g) => g.into_inner().to_string(),
        other => format!("{other:?}"),
    };
    // Two emails of 1 s and one report of 3 s, all at once.
    let store = store(&[(1, "email"), (2, "email"), (3, "report")]);
    let mut during = Vec::new();
    on_paused_runtime(&recorder, async {
        let registry = KindRegistry::new(|t: &Task| t.kind)
            .register("email", Sleeps(std::time::Duration::from_secs(1)))
            .unwrap()
            .register("report", Sleeps(std::time::Duration::from_secs(3)))
            .unwrap();
        let mut o = options(3);
        o.num_handlers = 4;
        let worker = Worker::new(store.clone(), registry, o).unwrap();
        let run = tokio::spawn(async move { worker.run().await });
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        during = series(snapshotter.snapshot(), IN_FLIGHT_BY_KIND, gauge);
        run.await.unwrap();
    });
    assert_eq!(
        during,
        ["email=2", "report=1"],
        "in flight half a second in"
    );
    let after = recorder.snapshotter().snapshot();
    let durations = series(after, JOB_DURATION_BY_KIND_SECONDS, |v| match v {
        DebugValue::Histogram(h) => {
            format!("{:?}", h.iter().map(|x| x.into_inner()).collect::<Vec<_>>())
        }
        other => format!("{other:?}"),
    });
    assert_eq!(durations, ["email=[1.0, 1.0]", "report=[3.0]"]);
    let at_end = series(recorder.snapshotter().snapshot(), IN_FLIGHT_BY_KIND, gauge);
    assert_eq!(at_end, ["email=0", "report=0"], "counted out when done");
}

/// Fails every job, noting when (on tokio's clock) each attempt ran.
#[derive(Clone, Default)]
struct FailsAlways(Arc<Mutex<Vec<(i64, tokio::time::Instant)>>>);
impl Handler<Store> for FailsAlways {
    async fn handle(
        &self,
        job: &mut MemoryJob<Task>,
        _ctx: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        let now = tokio::time::Instant::now();
        self.0.lock().unwrap().push((job.record.id, now));
        Err(HandlerError::retryable("still broken"))
    }
}

impl FailsAlways {
    /// The gaps between the attempts of job `id`.
    fn gaps(&self, id: i64) -> Vec<std::time::Duration> {
        let times: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(got, _)| *got == id)
            .map(|(_, at)| *at)
            .collect();
        times.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_kind_may_set_its_own_retry_policy() {
    use std::time::Duration;
    use workerutil::{KindOptions, MemoryStoreOptions, Retry, RetryPolicy};
    // The store retries 5 times, 10 s apart; "charge" jobs once, 30 s later,
    // and "report" jobs answer through their handler: 2 times, doubling from 1 s.
    let store = Arc::new(Store::new({
        let mut o = MemoryStoreOptions::default();
        o.max_num_retries = 5;
        o.retry_after = Duration::from_secs(10);
        o
    }));
    for (id, kind) in [(1, "charge"), (2, "email"), (3, "report")] {
        store.enqueue(Task { id, kind });
    }
    struct Report(FailsAlways);
    impl Handler<Store> for Report {
        async fn handle(
            &self,
            job: &mut MemoryJob<Task>,
            ctx: &JobContext<Store>,
        ) -> Result<(), HandlerError> {
            self.0.handle(job, ctx).await
        }
        fn retry(&self, _record: &Task) -> Option<Retry> {
            let doubling = RetryPolicy {
                retry_after: Duration::from_secs(1),
                backoff_factor: 2.0,
                max_delay: Duration::from_secs(60),
                jitter: 0.0,
            };
            Some(Retry::new().max_retries(2).delay(doubling))
        }
    }
    let fails = FailsAlways::default();
    let charge = Retry::new()
        .max_retries(1)
        .delay(RetryPolicy::fixed(Duration::from_secs(30)));
    let registry = KindRegistry::new(|t: &Task| t.kind)
        .register_with("charge", fails.clone(), KindOptions::retry(charge))
        .unwrap()
        .register("email", fails.clone())
        .unwrap()
        .register("report", Report(fails.clone()))
        .unwrap();
    let mut o = options(2 + 6 + 3);
    o.interval = Duration::from_millis(100);
    let summary = Worker::new(store.clone(), registry, o).unwrap().run().await;
    assert_eq!(summary.dequeued, 11);
    let failures = |id| store.snapshot(id).unwrap().num_failures;
    for id in [1, 2, 3] {
        assert_eq!(store.state(id), Some(JobState::Failed), "job {id}");
    }
    assert_eq!(failures(1), 2, "charge: one retry");
    assert_eq!(failures(2), 6, "email: the store's five retries");
    assert_eq!(failures(3), 3, "report: its handler's two retries");
    // Each gap is the delay plus at most one poll interval.
    let near = |gaps: Vec<Duration>, delays: &[u64]| {
        assert_eq!(gaps.len(), delays.len(), "{gaps:?}");
        for (gap, delay) in gaps.iter().zip(delays) {
            let delay = Duration::from_secs(*delay);
            assert!(
                *gap >= delay && *gap <= delay + Duration::from_millis(200),
                "gap {gap:?}, delay {delay:?}"
            );
        }
    };
    near(fails.gaps(1), &[30]);
    near(fails.gaps(2), &[10, 10, 10, 10, 10]);
    near(fails.gaps(3), &[1, 2]);
}
