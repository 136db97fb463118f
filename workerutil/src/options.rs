//! Worker options.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The shortest poll `interval` allowed: a shorter one only burns the
/// database with empty claims (use wake-ups for low latency instead).
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The most jobs a worker may hold in handlers or in its claim-ahead buffer
/// (each counted alone), far above any real use: it keeps the sizes the worker
/// derives from them (4 × handlers, semaphores) in range.
const MAX_JOBS_HELD: usize = 1_000_000;

/// The least default bound of the adaptive claim-ahead allowance
/// ([`WorkerOptions::max_claim_ahead`]). Measured on no-op jobs: with a bound
/// of `4 × num_handlers`, 8 handlers ran at 0.37 × the raw-SQL floor, claims
/// of a few dozen rows each bounding the rate; with 1,000, at 0.96 × (see
/// docs/benchmarks.md).
pub const DEFAULT_MAX_CLAIM_AHEAD: usize = 1_000;

impl WorkerOptions {
    /// The bound of the adaptive claim-ahead allowance these options give.
    pub fn claim_ahead_bound(&self) -> usize {
        self.max_claim_ahead.unwrap_or_else(|| {
            self.num_handlers
                .saturating_mul(4)
                .max(DEFAULT_MAX_CLAIM_AHEAD)
        })
    }
}

/// How a [`Worker`](crate::Worker) runs. Build with [`WorkerOptions::new`] and
/// override fields; [`WorkerOptions::validate`] runs when the worker is created.
///
/// Deserializable from a config file: `name` is required, every other field
/// left out keeps its default, durations are written as in
/// [`crate::duration`] (an optional one may be `"off"`), and an unknown field
/// is refused.
///
/// ```
/// let o: workerutil::WorkerOptions = serde_json::from_str(
///     r#"{ "name": "emails", "num_handlers": 8, "max_interval": "30s" }"#,
/// ).unwrap();
/// assert_eq!(o.num_handlers, 8);
/// assert_eq!(o.interval, std::time::Duration::from_secs(1)); // the default
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// The worker's name, used in logs, spans and events. Required.
    pub name: String,
    /// The host name recorded on claimed jobs. `None` uses the machine's host name.
    #[serde(default)]
    pub hostname: Option<String>,
    /// How many jobs run at once. At least 1. Default 1.
    #[serde(default = "default::num_handlers")]
    pub num_handlers: usize,
    /// The most jobs one dequeue call may claim. `None` (the default) claims as
    /// many as there are free handler slots. Extra conditions from
    /// `pre_dequeue` apply to each row on its own, so a worker whose budget is an
    /// aggregate (total cost of running jobs) should set `Some(1)`.
    #[serde(default)]
    pub max_per_dequeue: Option<usize>,
    /// Stop dequeuing after this many jobs were dequeued, then wait for them to
    /// finish and return. `None` (the default) runs until shut down.
    #[serde(default)]
    pub num_total_jobs: Option<u64>,
    /// Stop dequeuing after the worker has been running this long, then wait for
    /// the running jobs and return. `None` (the default) runs until shut down.
    #[serde(default, with = "crate::duration::option")]
    pub max_active_time: Option<Duration>,
    /// How many jobs the worker may claim beyond its free handler slots, into a
    /// local buffer, so the next handler starts without a round trip to the
    /// store. Buffered jobs are heartbeated like running ones and handed back to
    /// the queue (fenced requeue) at once on any shutdown. `Some(n)`: always
    /// `n`. `None` (the default): 0 when `max_per_dequeue` is set (budgeted
    /// workers decide job by job), else adaptive (see `max_claim_ahead`),
    /// starting at what the store suggests (`num_handlers` for the in-memory
    /// and the Postgres store).
    #[serde(default)]
    pub claim_ahead: Option<usize>,
    /// With `claim_ahead` left `None` (and no `max_per_dequeue`), the
    /// claim-ahead allowance adapts: it starts at what the store suggests and
    /// follows twice the jobs the handlers start during one claim's round trip
    /// (Little's law), from 1 for slow jobs up to this bound for fast ones. The
    /// bound is what one process may hold beyond its handlers: jobs it has
    /// claimed but not started cannot run elsewhere, so a lower bound spreads a
    /// short queue more evenly across processes, a higher one lets one process
    /// run fast jobs with fewer, bigger claims. `None` (the default): the
    /// larger of `4 × num_handlers` and [`DEFAULT_MAX_CLAIM_AHEAD`] (1,000).
    /// The allowance reaches a bound that high only for jobs that finish in
    /// well under a round trip, so what one process holds stays about two
    /// claims' worth of its own work: a few milliseconds. Each resize is
    /// logged at TRACE with the rate and round trip behind it
    /// (`RUST_LOG=workerutil::ahead=trace`).
    #[serde(default)]
    pub max_claim_ahead: Option<usize>,
    /// How many dequeue calls may be in flight at once while the queue keeps
    /// filling every claim: a second claim starts while the first is still on
    /// its way, so the store's round trip no longer bounds throughput. An idle
    /// queue (a claim that came back short) is always polled by one claim at a
    /// time. `None` (the default): 1 when `max_per_dequeue` is set (budgeted
    /// workers decide job by job), else what the store suggests (2 for the
    /// in-memory and the Postgres store).
    #[serde(default)]
    pub concurrent_dequeues: Option<usize>,
    /// How long to wait before polling again after a dequeue found nothing (or
    /// `pre_dequeue` declined, or the store failed). At least [`MIN_INTERVAL`]
    /// (10 ms). Default 1 s.
    #[serde(default = "default::interval", with = "crate::duration")]
    pub interval: Duration,
    /// Adaptive polling: while dequeues keep finding nothing, the wait doubles
    /// from `interval` up to this; it drops back to `interval` as soon as a job
    /// is found or the store sends a wake-up. While the store's wake-up source
    /// is down (listener disconnected) the wait stays at `interval`. `None`
    /// (the default) never backs off. With LISTEN/NOTIFY wake-ups, 30 s is a
    /// sensible value for new jobs, which notifications bring at once; a job
    /// that comes due later (scheduled, a retry, a wait's timeout) is
    /// announced by nothing, so unless the store wakes the worker for it (a
    /// listening `DbStore`'s claim cursor probe does, within its interval) a
    /// poll finds it, and it may wait up to this.
    #[serde(default, with = "crate::duration::option")]
    pub max_interval: Option<Duration>,
    /// How often running jobs are heartbeated. Keep it well below the store's
    /// stalled max age. Default 1 s.
    #[serde(default = "default::heartbeat_interval", with = "crate::duration")]
    pub heartbeat_interval: Duration,
    /// A job running longer than this is canceled and marked errored with
    /// "job exceeded maximum runtime of …". `None` (the default) means no limit.
    #[serde(default, with = "crate::duration::option")]
    pub max_runtime_per_job: Option<Duration>,
    /// When heartbeats keep failing for longer than this, the worker cancels its
    /// own running jobs: a resetter may already have requeued them for another
    /// worker, so going on could run a job twice at once. Set it below the
    /// store's stalled max age. `None` disables it. Default 15 s (half the
    /// Postgres store's default stalled max age).
    #[serde(
        default = "default::heartbeat_failure_limit",
        with = "crate::duration::option"
    )]
    pub heartbeat_failure_limit: Option<Duration>,
    /// On a graceful shutdown, how long running jobs may take to finish before
    /// they are canceled and put back in the queue. Default 30 s.
    #[serde(default = "default::drain_timeout", with = "crate::duration")]
    pub drain_timeout: Duration,
    /// Capacity of the event channel ([`Worker::subscribe`](crate::Worker::subscribe)).
    /// Default 1024.
    #[serde(default = "default::event_capacity")]
    pub event_capacity: usize,
}

/// The defaults of fields a config file leaves out, read from
/// [`WorkerOptions::new`] so they are stated once.
mod default {
    use std::time::Duration;

    use super::WorkerOptions;

    fn defaults() -> WorkerOptions {
        WorkerOptions::new(String::new())
    }

    pub(super) fn num_handlers() -> usize {
        defaults().num_handlers
    }

    pub(super) fn interval() -> Duration {
        defaults().interval
    }

    pub(super) fn heartbeat_interval() -> Duration {
        defaults().heartbeat_interval
    }

    pub(super) fn heartbeat_failure_limit() -> Option<Duration> {
        defaults().heartbeat_failure_limit
    }

    pub(super) fn drain_timeout() -> Duration {
        defaults().drain_timeout
    }

    pub(super) fn event_capacity() -> usize {
        defaults().event_capacity
    }
}

impl WorkerOptions {
    /// Options with the given name and every other field at its default.
    pub fn new(name: impl Into<String>) -> Self {
        WorkerOptions {
            name: name.into(),
            hostname: None,
            num_handlers: 1,
            max_per_dequeue: None,
            claim_ahead: None,
            max_claim_ahead: None,
            concurrent_dequeues: None,
            num_total_jobs: None,
            max_active_time: None,
            interval: Duration::from_secs(1),
            max_interval: None,
            heartbeat_interval: Duration::from_secs(1),
            max_runtime_per_job: None,
            heartbeat_failure_limit: Some(Duration::from_secs(15)),
            drain_timeout: Duration::from_secs(30),
            event_capacity: 1024,
        }
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), Error> {
        fn invalid(field: &'static str, reason: &str) -> Result<(), Error> {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        }
        if self.name.trim().is_empty() {
            return invalid("name", "must not be empty");
        }
        if matches!(&self.hostname, Some(h) if h.trim().is_empty()) {
            return invalid("hostname", "must not be empty when set");
        }
        // Stores write it into the job (a database's text cannot hold a NUL).
        if matches!(&self.hostname, Some(h) if h.contains('\0')) {
            return invalid("hostname", "must not hold a NUL character (U+0000)");
        }
        // Times are added to clock readings and to each other: bounded
        // (`duration::MAX`), those sums cannot overflow.
        for (field, duration) in [
            ("max_active_time", self.max_active_time),
            ("interval", Some(self.interval)),
            ("max_interval", self.max_interval),
            ("heartbeat_interval", Some(self.heartbeat_interval)),
            // `Duration::MAX` is "no limit" there (`KindOptions::no_timeout`).
            (
                "max_runtime_per_job",
                self.max_runtime_per_job.filter(|d| *d != Duration::MAX),
            ),
            ("heartbeat_failure_limit", self.heartbeat_failure_limit),
            ("drain_timeout", Some(self.drain_timeout)),
        ] {
            if duration.is_some_and(|d| d > crate::duration::MAX) {
                return invalid(field, "must be at most 100 years");
            }
        }
        if self.num_handlers == 0 {
            return invalid("num_handlers", "must be at least 1");
        }
        if self.num_handlers > MAX_JOBS_HELD {
            return invalid("num_handlers", "must be at most 1,000,000");
        }
        if self.claim_ahead.is_some_and(|n| n > MAX_JOBS_HELD) {
            return invalid("claim_ahead", "must be at most 1,000,000");
        }
        if self.max_claim_ahead.is_some_and(|n| n > MAX_JOBS_HELD) {
            return invalid("max_claim_ahead", "must be at most 1,000,000");
        }
        if self.max_per_dequeue == Some(0) {
            return invalid("max_per_dequeue", "must be at least 1 when set");
        }
        if self.concurrent_dequeues == Some(0) {
            return invalid("concurrent_dequeues", "must be at least 1 when set");
        }
        if self.num_total_jobs == Some(0) {
            return invalid("num_total_jobs", "must be at least 1 when set");
        }
        if self.max_active_time == Some(Duration::ZERO) {
            return invalid("max_active_time", "must be positive when set");
        }
        if self.interval < MIN_INTERVAL {
            return invalid(
                "interval",
                &format!(
                    "{:?} is below the minimum of {MIN_INTERVAL:?}; use wake-ups (LISTEN/NOTIFY) for lower latency",
                    self.interval
                ),
            );
        }
        if self.max_interval.is_some_and(|max| max < self.interval) {
            return invalid("max_interval", "must be at least interval");
        }
        if self.heartbeat_interval.is_zero() {
            return invalid("heartbeat_interval", "must be positive");
        }
        if self.max_runtime_per_job == Some(Duration::ZERO) {
            return invalid("max_runtime_per_job", "must be positive when set");
        }
        if let Some(limit) = self.heartbeat_failure_limit
            && limit < self.heartbeat_interval
        {
            return invalid(
                "heartbeat_failure_limit",
                "must be at least heartbeat_interval",
            );
        }
        if self.event_capacity == 0 {
            return invalid("event_capacity", "must be at least 1");
        }
        if self.event_capacity > MAX_EVENT_CAPACITY {
            return invalid("event_capacity", "must be at most 1,048,576");
        }
        Ok(())
    }
}

/// The most events a worker's broadcast channel buffers.
const MAX_EVENT_CAPACITY: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_ahead_bound_is_at_least_a_thousand_jobs() {
        let mut o = WorkerOptions::new("w");
        o.num_handlers = 8;
        assert_eq!(o.claim_ahead_bound(), DEFAULT_MAX_CLAIM_AHEAD);
        o.num_handlers = 400;
        assert_eq!(o.claim_ahead_bound(), 1_600);
        o.max_claim_ahead = Some(3);
        assert_eq!(o.claim_ahead_bound(), 3);
    }

    #[test]
    fn defaults_are_valid() {
        WorkerOptions::new("w").validate().unwrap();
    }

    /// What an application's config file holds: a worker and a retry policy.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        worker: WorkerOptions,
        #[serde(default)]
        retry: crate::RetryPolicy,
    }

    #[test]
    fn a_config_file_sets_only_what_it_names() {
        let config: Config = serde_json::from_str(
            r#"{
                "worker": {
                    "name": "emails",
                    "num_handlers": 8,
                    "interval": "250ms",
                    "max_interval": "30s",
                    "max_runtime_per_job": "1h 30m",
                    "heartbeat_failure_limit": "off",
                    "num_total_jobs": 1000
                },
                "retry": { "retry_after": "1m", "backoff_factor": 3.0 }
            }"#,
        )
        .unwrap();
        let o = &config.worker;
        assert_eq!(o.name, "emails");
        assert_eq!(o.num_handlers, 8);
        assert_eq!(o.interval, Duration::from_millis(250));
        assert_eq!(o.max_interval, Some(Duration::from_secs(30)));
        assert_eq!(o.max_runtime_per_job, Some(Duration::from_secs(5400)));
        assert_eq!(o.heartbeat_failure_limit, None);
        assert_eq!(o.num_total_jobs, Some(1000));
        // Everything else is WorkerOptions::new's.
        let d = WorkerOptions::new("emails");
        assert_eq!(o.heartbeat_interval, d.heartbeat_interval);
        assert_eq!(o.drain_timeout, d.drain_timeout);
        assert_eq!(o.event_capacity, d.event_capacity);
        assert_eq!(o.hostname, None);
        assert_eq!(o.max_active_time, None);
        o.validate().unwrap();
        let r = &config.retry;
        assert_eq!(r.retry_after, Duration::from_secs(60));
        assert_eq!(r.backoff_factor, 3.0);
        assert_eq!(r.max_delay, crate::RetryPolicy::default().max_delay);
    }

    #[test]
    fn written_options_read_back_the_same() {
        let mut o = WorkerOptions::new("w");
        o.max_active_time = Some(Duration::from_millis(1500));
        let written = serde_json::to_value(&o).unwrap();
        assert_eq!(written["heartbeat_failure_limit"], "15s");
        assert_eq!(written["max_active_time"], "1s 500ms");
        assert_eq!(written["max_interval"], "off");
        let read: WorkerOptions = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), written);
    }

    #[test]
    fn a_config_error_names_the_field_or_the_text() {
        let err = |text: &str| {
            serde_json::from_str::<Config>(text)
                .unwrap_err()
                .to_string()
        };
        let e = err(r#"{"worker": {"num_handlers": 2}}"#);
        assert!(e.starts_with("missing field `name`"), "{e}");
        let e = err(r#"{"worker": {"name": "w", "handlers": 2}}"#);
        assert!(
            e.starts_with("unknown field `handlers`, expected one of"),
            "{e}"
        );
        let e = err(r#"{"worker": {"name": "w", "interval": "30 parsecs"}}"#);
        assert!(
            e.starts_with(r#""30 parsecs" is not a duration: unknown time unit "parsecs""#),
            "{e}"
        );
        let e = err(r#"{"worker": {"name": "w"}, "retry": {"delay": "1s"}}"#);
        assert!(e.starts_with("unknown field `delay`"), "{e}");
        // Values are checked where they are used, by validate.
        let config: Config =
            serde_json::from_str(r#"{"worker": {"name": "w", "num_handlers": 0}}"#).unwrap();
        assert!(config.worker.validate().is_err());
    }

    #[test]
    fn each_bad_field_is_named() {
        type Breaker = Box<dyn Fn(&mut WorkerOptions)>;
        let cases: Vec<(&str, Breaker)> = vec![
            ("name", Box::new(|o| o.name = " ".into())),
            ("hostname", Box::new(|o| o.hostname = Some(String::new()))),
            ("hostname", Box::new(|o| o.hostname = Some("a\0b".into()))),
            ("num_handlers", Box::new(|o| o.num_handlers = 0)),
            (
                "max_claim_ahead",
                Box::new(|o| o.max_claim_ahead = Some(2_000_000)),
            ),
            ("claim_ahead", Box::new(|o| o.claim_ahead = Some(2_000_000))),
            ("num_total_jobs", Box::new(|o| o.num_total_jobs = Some(0))),
            (
                "concurrent_dequeues",
                Box::new(|o| o.concurrent_dequeues = Some(0)),
            ),
            ("max_per_dequeue", Box::new(|o| o.max_per_dequeue = Some(0))),
            (
                "max_active_time",
                Box::new(|o| o.max_active_time = Some(Duration::ZERO)),
            ),
            ("interval", Box::new(|o| o.interval = Duration::ZERO)),
            (
                "interval",
                Box::new(|o| o.interval = Duration::from_nanos(1)),
            ),
            (
                "max_interval",
                Box::new(|o| o.max_interval = Some(Duration::from_millis(100))),
            ),
            (
                "heartbeat_interval",
                Box::new(|o| o.heartbeat_interval = Duration::ZERO),
            ),
            (
                "max_runtime_per_job",
                Box::new(|o| o.max_runtime_per_job = Some(Duration::ZERO)),
            ),
            (
                "heartbeat_failure_limit",
                Box::new(|o| o.heartbeat_failure_limit = Some(Duration::from_millis(1))),
            ),
            ("event_capacity", Box::new(|o| o.event_capacity = 0)),
        ];
        for (field, break_it) in cases {
            let mut o = WorkerOptions::new("w");
            break_it(&mut o);
            match o.validate() {
                Err(Error::InvalidOption { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected an error, got {other:?}"),
            }
        }
    }
}
