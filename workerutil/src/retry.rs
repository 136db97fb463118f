//! Retry policies: how long an errored job waits ([`RetryPolicy`]), and the
//! override a handler may set for its jobs ([`Retry`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long an errored job waits before its next attempt.
///
/// The delay of retry `n` (counting from 0) is
/// `min(max_delay, retry_after * backoff_factor^n)`, then scaled by a random
/// factor in `[1 - jitter, 1 + jitter]`. The Postgres store computes it in SQL,
/// on the database's clock; [`MemoryStore`](crate::MemoryStore) computes it on
/// tokio's clock without the jitter, so a paused-clock test sees exact delays.
///
/// Deserializable (unset fields default; durations as in [`crate::duration`]):
/// `{ "retry_after": "30s", "max_delay": "2h" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// The first delay. Default 10 s.
    #[serde(with = "crate::duration")]
    pub retry_after: Duration,
    /// Multiplier per failed attempt; 1.0 gives a fixed delay. Default 2.0.
    pub backoff_factor: f64,
    /// Cap on the delay before jitter. Default 1 h.
    #[serde(with = "crate::duration")]
    pub max_delay: Duration,
    /// Relative jitter in `[0, 1)`; 0.1 spreads delays ±10 %. Default 0.1.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retry_after: Duration::from_secs(10),
            backoff_factor: 2.0,
            max_delay: Duration::from_secs(3600),
            jitter: 0.1,
        }
    }
}

impl RetryPolicy {
    /// A fixed delay with no jitter.
    pub fn fixed(delay: Duration) -> Self {
        RetryPolicy {
            retry_after: delay,
            backoff_factor: 1.0,
            max_delay: delay,
            jitter: 0.0,
        }
    }

    /// The delay before retry `n` (0 for the first), without jitter.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let p = workerutil::RetryPolicy { jitter: 0.0, ..Default::default() };
    /// assert_eq!(p.delay(0), Duration::from_secs(10));
    /// assert_eq!(p.delay(2), Duration::from_secs(40));
    /// assert_eq!(p.delay(20), Duration::from_secs(3600)); // capped
    /// ```
    pub fn delay(&self, n: u32) -> Duration {
        let secs = self.retry_after.as_secs_f64() * self.backoff_factor.powf(f64::from(n));
        // `min` passes over a NaN (0 · ∞); the cap keeps an unchecked
        // policy's huge `max_delay` convertible.
        let cap = self.max_delay.min(crate::duration::MAX).as_secs_f64();
        Duration::from_secs_f64(secs.min(cap).max(0.0))
    }

    /// Checks the policy; on a bad value returns the field's name and why.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if !(self.backoff_factor.is_finite() && self.backoff_factor >= 1.0) {
            return Err(("backoff_factor", "must be a finite number >= 1.0"));
        }
        if !(self.jitter.is_finite() && (0.0..1.0).contains(&self.jitter)) {
            return Err(("jitter", "must be in [0, 1)"));
        }
        if self.max_delay < self.retry_after {
            return Err(("max_delay", "must be at least retry_after"));
        }
        // As every duration: a delay past it is no retry, and overflows
        // the arithmetic that schedules it.
        if self.max_delay > crate::duration::MAX {
            return Err(("max_delay", "must be at most 100 years"));
        }
        Ok(())
    }
}

/// A retry policy of one's own, overriding the store's for some jobs: what a
/// [`Handler`](crate::Handler) answers from `retry`, or a kind sets through
/// [`KindOptions::with_retry`](crate::KindOptions::with_retry). Each part left
/// `None` is the store's. A job's own retry limit (the Postgres store's
/// `max_retries_column`) still wins over `max_retries`.
///
/// ```
/// # use std::time::Duration;
/// use workerutil::{Retry, RetryPolicy};
///
/// // Retried once, a minute later; a second error fails the job.
/// let retry = Retry::new()
///     .max_retries(1)
///     .delay(RetryPolicy::fixed(Duration::from_secs(60)));
/// assert_eq!(retry.max_retries, Some(1));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Retry {
    /// How many times an errored job is tried again before it fails; 0 makes
    /// the first error final. `None`: the store's.
    pub max_retries: Option<u32>,
    /// The delay before each retry. `None`: the store's.
    pub delay: Option<RetryPolicy>,
}

impl Retry {
    /// An override that overrides nothing yet.
    pub fn new() -> Retry {
        Retry::default()
    }

    /// Sets how many times an errored job is retried.
    pub fn max_retries(mut self, max_retries: u32) -> Retry {
        self.max_retries = Some(max_retries);
        self
    }

    /// Sets the delay before each retry.
    pub fn delay(mut self, delay: RetryPolicy) -> Retry {
        self.delay = Some(delay);
        self
    }

    /// This override without a delay that fails [`RetryPolicy::check`] (a
    /// handler's answer, or a kind's `retry` field set without
    /// [`KindOptions::with_retry`](crate::KindOptions::with_retry)), with a
    /// warning naming the field: the store's delay applies instead. Not a
    /// failure of the job: its error is its own and worth the retry, and the
    /// store's policy was checked when the store was built.
    pub(crate) fn without_invalid_delay(mut self) -> Retry {
        if let Some(Err((field, reason))) = self.delay.as_ref().map(RetryPolicy::check) {
            tracing::warn!(
                field = %format_args!("retry.delay.{field}"),
                reason,
                "the handler's retry policy is invalid; the store's delay applies"
            );
            self.delay = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delay stays at the cap however many failures, and a policy
    /// nobody checked (a handler's own) cannot make it panic.
    #[test]
    fn delays_stay_at_the_cap_and_huge_values_are_refused_or_held() {
        let p = RetryPolicy {
            jitter: 0.0,
            ..Default::default()
        };
        assert_eq!(p.delay(5_000), Duration::from_secs(3600));
        let unchecked = RetryPolicy {
            retry_after: Duration::ZERO,
            backoff_factor: 1e300,
            max_delay: Duration::MAX,
            jitter: 0.0,
        };
        assert_eq!(unchecked.delay(u32::MAX), crate::duration::MAX);
        assert_eq!(
            unchecked.check(),
            Err(("max_delay", "must be at most 100 years"))
        );
    }
}
