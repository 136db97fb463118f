//! The runner every periodic service shares (purger, resetter, cron, gauges,
//! node heartbeats, leader election, the log dispatcher, consumer
//! rebalancing, the claim cursor's probe): start, wait, run a pass, until a
//! token fires. Each service writes only its pass ([`Pass`]), which says
//! when the next one runs ([`Next`]); the runner owns the waiting, the
//! jitter, the back-off after failures, the wake-ups, the stop and a
//! `tracing` span per pass.
//!
//! A trait rather than a closure: a pass keeps state from one pass to the
//! next, and an `async` closure that borrows its state makes a future the
//! compiler cannot prove `Send` for every lifetime, so it could not be
//! spawned.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workerutil::Wakeups;

/// What a pass tells the runner: when the next pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The pass did its work: the next one after the interval (with the
    /// jitter). Ends a back-off.
    Interval,
    /// The pass did its work: the next one after this long (no jitter).
    /// Ends a back-off.
    After(Duration),
    /// The pass failed, and logged why: the next one after the back-off,
    /// which doubles with each failure in a row up to its bound.
    BackOff,
}

/// A periodic service, as the runner sees it.
pub(crate) trait Pass {
    /// A new span for one pass, named by the service (`purger`, `node`, …).
    fn span(&self) -> tracing::Span;

    /// One pass; what it returns says when the next one runs.
    async fn pass(&mut self) -> Next;
}

/// How a service's passes are run. Build it with [`Runner::every`], adjust it
/// with the other methods, then [`run`](Runner::run) it.
#[derive(Debug)]
pub(crate) struct Runner {
    interval: Duration,
    /// Relative spread in `[0, 1)`: waits are multiplied by a factor drawn
    /// from `[1 - jitter, 1 + jitter]`.
    jitter: f64,
    /// The longest wait after failures (before jitter); the interval means no
    /// back-off.
    max_backoff: Duration,
    /// The wait before the first pass; zero runs it at once.
    first_after: Duration,
    /// Waits count from each pass's start (a steady rate) instead of its end.
    steady: bool,
    /// A stop abandons a pass in progress instead of letting it finish.
    abandon_on_stop: bool,
    /// Also ends a wait early.
    wakeups: Option<Wakeups>,
}

impl Runner {
    /// Passes `interval` apart (from the end of one to the start of the
    /// next), the first at once; no jitter, no back-off, no wake-ups; a stop
    /// lets a pass in progress finish.
    pub(crate) fn every(interval: Duration) -> Self {
        Runner {
            interval,
            jitter: 0.0,
            max_backoff: interval,
            first_after: Duration::ZERO,
            steady: false,
            abandon_on_stop: false,
            wakeups: None,
        }
    }

    /// Spreads every interval and back-off wait by ±`jitter` (a fraction,
    /// clamped to `[0, 0.99]`), so processes started together drift apart.
    pub(crate) fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 0.99)
        } else {
            0.0
        };
        self
    }

    /// After a failed pass ([`Next::BackOff`]) waits twice the interval, then
    /// twice that for each further failure in a row, up to `max` (at least
    /// the interval); a pass that succeeds brings the interval back.
    pub(crate) fn backoff_up_to(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(self.interval);
        self
    }

    /// Waits `delay` before the first pass.
    pub(crate) fn first_after(mut self, delay: Duration) -> Self {
        self.first_after = delay;
        self
    }

    /// Counts each wait from the start of the pass before, so passes keep a
    /// steady rate whatever they take; a pass that takes longer than the wait
    /// is followed by the next at once.
    pub(crate) fn steady_rate(mut self) -> Self {
        self.steady = true;
        self
    }

    /// A stop drops a pass in progress (it must be safe to drop at any
    /// await) instead of waiting for it to finish.
    pub(crate) fn abandon_pass_on_stop(mut self) -> Self {
        self.abandon_on_stop = true;
        self
    }

    /// Each of these wake-ups ends a wait early (the next pass runs at once);
    /// one that arrives during a pass ends the wait after it.
    pub(crate) fn woken_by(mut self, wakeups: Wakeups) -> Self {
        self.wakeups = Some(wakeups);
        self
    }

    /// Runs `service`'s passes until `stop` fires, each inside a new span
    /// of its own. A stop during a wait ends it at once; a stop during a
    /// pass ends the run once the pass is over (or at once, with
    /// [`abandon_pass_on_stop`](Self::abandon_pass_on_stop)).
    pub(crate) async fn run(mut self, stop: &CancellationToken, service: &mut impl Pass) {
        let mut failures: u32 = 0;
        let mut next =
            (!self.first_after.is_zero()).then(|| later(Instant::now(), self.first_after));
        loop {
            // The first pass, due at once, runs without a look at `stop`,
            // as every service's loop did before it shared this one.
            if let Some(at) = next
                && !self.wait_until(stop, at).await
            {
                return;
            }
            if let Some(w) = &mut self.wakeups {
                w.mark_seen();
            }
            let started = Instant::now();
            let span = service.span();
            let this = service.pass().instrument(span);
            let outcome = if self.abandon_on_stop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    outcome = this => outcome,
                }
            } else {
                this.await
            };
            let wait = match outcome {
                Next::Interval => {
                    failures = 0;
                    self.jittered(self.interval)
                }
                Next::After(wait) => {
                    failures = 0;
                    wait
                }
                Next::BackOff => {
                    failures = failures.saturating_add(1);
                    self.jittered(self.backoff(failures))
                }
            };
            let from = if self.steady { started } else { Instant::now() };
            next = Some(later(from, wait));
        }
    }

    /// Sleeps until `at` or a wake-up; false when `stop` fired first.
    async fn wait_until(&mut self, stop: &CancellationToken, at: Instant) -> bool {
        let woken = async {
            match &mut self.wakeups {
                Some(w) => w.woken().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => false,
            () = tokio::time::sleep_until(at) => true,
            () = woken => true,
        }
    }

    /// The wait after `failures` failed passes in a row.
    fn backoff(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures);
        self.interval.saturating_mul(factor).min(self.max_backoff)
    }

    fn jittered(&self, wait: Duration) -> Duration {
        if self.jitter == 0.0 {
            return wait;
        }
        let factor = 1.0 + self.jitter * (2.0 * unit_random() - 1.0);
        Duration::try_from_secs_f64(wait.as_secs_f64() * factor).unwrap_or(Duration::MAX)
    }
}

/// `wait` after `from`; an interval too long to add is about 30 years, as
/// tokio's own sleep takes it, not a panic.
fn later(from: Instant, wait: Duration) -> Instant {
    from.checked_add(wait)
        .unwrap_or_else(|| from + Duration::from_secs(86_400 * 365 * 30))
}

/// A random number in `[0, 1)`, good enough to spread timers: each of the
/// standard library's `RandomState`s has fresh random keys, which spares the
/// library a random-number crate.
fn unit_random() -> f64 {
    let bits = RandomState::new().hash_one(0u8) >> 11;
    #[allow(clippy::cast_precision_loss)] // 53 bits: exact in an f64
    let unit = bits as f64 / (1u64 << 53) as f64;
    unit
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
