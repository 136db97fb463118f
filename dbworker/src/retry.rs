//! `RetryPolicy`: how long an errored job waits, computed by the database.

use std::time::Duration;

/// How long an errored job waits before its next attempt.
///
/// The delay of retry `n` (counting from 0) is
/// `min(max_delay, retry_after * backoff_factor^n)`, then scaled by a random
/// factor in `[1 - jitter, 1 + jitter]`. Computed by the database (its clock).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The first delay. Default 10 s.
    pub retry_after: Duration,
    /// Multiplier per failed attempt; 1.0 gives a fixed delay. Default 2.0.
    pub backoff_factor: f64,
    /// Cap on the delay before jitter. Default 1 h.
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
}
