//! `JobDefaults`: what a kind of job sets for its jobs unless told otherwise.

use std::time::Duration;

use workerutil::{KindOptions, Retry, RetryPolicy};

use crate::error::{Error, Result};

/// A kind's defaults, from [`JobArgs::defaults`](super::JobArgs::defaults).
///
/// `queue` and `priority` go into each new job ([`NewJob::args`](crate::NewJob::args);
/// the `NewJob` builder methods called after it override them), so the
/// table needs those columns. `max_retries`, `retry` and `timeout` apply
/// where the job runs, as the kind's [`KindOptions`] (no column needed); a
/// job's own limit ([`NewJob::max_retries`](crate::NewJob::max_retries))
/// still wins.
///
/// ```
/// use std::time::Duration;
/// use dbworker::{RetryPolicy, JobDefaults};
///
/// let defaults = JobDefaults::new()
///     .queue("emails")
///     .priority(5)
///     .max_retries(3)
///     .retry(RetryPolicy::fixed(Duration::from_secs(10)))
///     .timeout(Duration::from_secs(30));
/// assert!(defaults.validate().is_ok());
/// assert_eq!(defaults.kind_options()?.max_runtime, Some(Duration::from_secs(30)));
/// # Ok::<(), dbworker::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct JobDefaults {
    /// The queue new jobs go to (needs the table's `JobTableOptions::queue_column`).
    /// `None` (the default): the column's default.
    pub queue: Option<String>,
    /// New jobs' priority (needs the table's `JobTableOptions::priority_column`). `None`
    /// (the default): the column's default.
    pub priority: Option<i32>,
    /// How many times an errored job is retried, overriding the store's
    /// `max_num_retries`. `None` (the default): the store's.
    pub max_retries: Option<u32>,
    /// The delay before each retry, overriding the store's `retry`. `None`
    /// (the default): the store's.
    pub retry: Option<RetryPolicy>,
    /// How long one job may run before it times out, overriding the worker's
    /// `max_runtime_per_job`. Positive. `None` (the default): the worker's;
    /// `Duration::MAX` ([`no_timeout`](Self::no_timeout)): no limit.
    pub timeout: Option<Duration>,
}

impl JobDefaults {
    /// No default: the table's, the store's and the worker's apply.
    pub fn new() -> JobDefaults {
        JobDefaults::default()
    }

    /// Sets the queue.
    pub fn queue(mut self, queue: impl Into<String>) -> JobDefaults {
        self.queue = Some(queue.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> JobDefaults {
        self.priority = Some(priority);
        self
    }

    /// Sets the retry limit.
    pub fn max_retries(mut self, max_retries: u32) -> JobDefaults {
        self.max_retries = Some(max_retries);
        self
    }

    /// Sets the retry delay.
    pub fn retry(mut self, retry: RetryPolicy) -> JobDefaults {
        self.retry = Some(retry);
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> JobDefaults {
        self.timeout = Some(timeout);
        self
    }

    /// Jobs of the kind run without a time limit, whatever the worker's
    /// (River's `-1`): `timeout` becomes `Duration::MAX`.
    pub fn no_timeout(self) -> JobDefaults {
        self.timeout(Duration::MAX)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidOption { field, reason });
        if self.queue.as_deref() == Some("") {
            return bad("queue", "must not be empty".into());
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return bad("timeout", "must be positive".into());
        }
        if let Some(Err((field, reason))) = self.retry.as_ref().map(RetryPolicy::check) {
            return bad("retry", format!("{field} {reason}"));
        }
        Ok(())
    }

    /// The kind's options for a [`KindRegistry`](workerutil::KindRegistry):
    /// `timeout` as its maximum runtime, `max_retries` and `retry` as its
    /// retry override. Defaults that fail [`validate`](Self::validate)
    /// are refused.
    pub fn kind_options(&self) -> Result<KindOptions> {
        self.validate()?;
        let mut options = KindOptions::default();
        if let Some(timeout) = self.timeout {
            options = options.with_max_runtime(timeout);
        }
        if self.max_retries.is_some() || self.retry.is_some() {
            let mut retry = Retry::new();
            retry.max_retries = self.max_retries;
            retry.delay = self.retry.clone();
            options = options.with_retry(retry);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let field = |d: JobDefaults| match d.validate() {
            Err(Error::InvalidOption { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(JobDefaults::new().queue("")), "queue");
        assert_eq!(field(JobDefaults::new().timeout(Duration::ZERO)), "timeout");
        let policy = RetryPolicy {
            jitter: 2.0,
            ..RetryPolicy::default()
        };
        assert_eq!(field(JobDefaults::new().retry(policy)), "retry");
    }

    #[test]
    fn no_defaults_are_no_kind_options() {
        assert_eq!(
            JobDefaults::new().kind_options().unwrap(),
            KindOptions::default()
        );
        let options = JobDefaults::new().max_retries(2).kind_options().unwrap();
        assert_eq!(options.retry.unwrap().max_retries, Some(2));
    }
}
