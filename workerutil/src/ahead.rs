//! Adaptive claim-ahead: how many claimed jobs a worker keeps waiting beyond
//! its free handlers.
//!
//! A claim is a round trip. To keep every handler busy while the next claim
//! is in flight, the buffer must hold what the handlers start during one
//! round trip (Little's law: jobs in the buffer = start rate × claim time).
//! Fast jobs need a deep buffer and big claims; slow jobs need almost none,
//! and a deep buffer would only hoard jobs that other processes could run.
//! So the allowance follows twice the measured rate × round trip, between 1
//! and a bound (`WorkerOptions::max_claim_ahead`). A fixed
//! `WorkerOptions::claim_ahead` turns the adaptation off.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of the newest sample in the moving averages.
const ALPHA: f64 = 0.25;

/// The claim-ahead allowance of one worker's dequeue loop.
#[derive(Debug)]
pub(crate) struct Ahead {
    value: usize,
    /// `None`: fixed at `value`.
    bound: Option<usize>,
    /// Jobs started per second (moving average).
    rate: Option<f64>,
    /// Seconds a claim takes (moving average).
    round_trip: Option<f64>,
    started: u64,
    since: Instant,
}

impl Ahead {
    /// An allowance that never changes.
    pub(crate) fn fixed(value: usize) -> Ahead {
        Ahead::new(value, None)
    }

    /// An allowance starting at `initial` and following the measured rate,
    /// between 1 and `max`.
    pub(crate) fn adaptive(initial: usize, max: usize) -> Ahead {
        Ahead::new(initial.min(max), Some(max))
    }

    fn new(value: usize, bound: Option<usize>) -> Ahead {
        Ahead {
            value,
            bound,
            rate: None,
            round_trip: None,
            started: 0,
            since: Instant::now(),
        }
    }

    /// The allowance now.
    pub(crate) fn get(&self) -> usize {
        self.value
    }

    /// A job started on a handler.
    pub(crate) fn job_started(&mut self) {
        self.started += 1;
    }

    /// A claim came back after `round_trip`: resize the allowance.
    pub(crate) fn claim_returned(&mut self, round_trip: Duration) {
        let Some(max) = self.bound else { return };
        let now = Instant::now();
        let elapsed = now.duration_since(self.since).as_secs_f64();
        if elapsed > 0.0 {
            let rate = self.started as f64 / elapsed;
            self.rate = Some(average(self.rate, rate));
            self.started = 0;
            self.since = now;
        }
        self.round_trip = Some(average(self.round_trip, round_trip.as_secs_f64()));
        let in_flight = 2.0 * self.rate.unwrap_or(0.0) * self.round_trip.unwrap_or(0.0);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to a usize bound first"
        )]
        let wanted = in_flight.ceil().clamp(1.0, max.max(1) as f64) as usize;
        self.value = wanted.min(max);
        tracing::trace!(
            allowance = self.value,
            rate = self.rate.unwrap_or(0.0),
            round_trip_ms = self.round_trip.unwrap_or(0.0) * 1e3,
            "claim-ahead resized"
        );
    }
}

fn average(old: Option<f64>, sample: f64) -> f64 {
    match old {
        Some(old) => old + ALPHA * (sample - old),
        None => sample,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `per_claim` jobs per claim of `round_trip`, `claims` times.
    async fn drive(ahead: &mut Ahead, claims: usize, per_claim: usize, round_trip: Duration) {
        for _ in 0..claims {
            tokio::time::advance(round_trip).await;
            for _ in 0..per_claim {
                ahead.job_started();
            }
            ahead.claim_returned(round_trip);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fast_jobs_grow_the_buffer_to_its_bound() {
        let mut ahead = Ahead::adaptive(8, 32);
        // Claim-bound: every claim's jobs start at once, so the rate is what
        // the buffer lets through; it grows claim after claim.
        let mut per_claim = 16;
        for _ in 0..10 {
            drive(&mut ahead, 1, per_claim, Duration::from_millis(2)).await;
            per_claim = 8 + ahead.get();
        }
        assert_eq!(ahead.get(), 32, "at the bound");
    }

    #[tokio::test(start_paused = true)]
    async fn slow_jobs_shrink_it_to_one() {
        let mut ahead = Ahead::adaptive(8, 32);
        // 8 handlers, jobs of one second: 8 starts a second, 2 ms claims.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(125)).await;
            ahead.job_started();
            ahead.claim_returned(Duration::from_millis(2));
        }
        assert_eq!(ahead.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn between_the_two_it_holds_what_one_round_trip_consumes() {
        let mut ahead = Ahead::adaptive(8, 1_000);
        // 5,000 jobs a second, 4 ms claims: 20 jobs per round trip, twice that.
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(4)).await;
            for _ in 0..20 {
                ahead.job_started();
            }
            ahead.claim_returned(Duration::from_millis(4));
        }
        assert!((38..=42).contains(&ahead.get()), "{}", ahead.get());
    }

    /// Captures what the `fmt` subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            let bytes = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_resize_is_logged_at_trace_with_its_inputs() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        // Tracing caches whether a callsite is enabled, for every thread; a
        // test on another thread, with no subscriber, can race this one's
        // registration and leave it disabled. Asked again, it is not.
        let mut adaptive = Ahead::adaptive(8, 1_000);
        for attempt in 0..5 {
            tracing::callsite::rebuild_interest_cache();
            if attempt > 0 {
                adaptive = Ahead::adaptive(8, 1_000);
            }
            drive(&mut adaptive, 1, 20, Duration::from_millis(4)).await;
            if !captured.text().is_empty() {
                break;
            }
        }
        let text = captured.text();
        assert!(text.contains("claim-ahead resized"), "{text}");
        assert!(text.contains("workerutil::ahead"), "{text}");
        assert!(
            text.contains(&format!("allowance={}", adaptive.get())),
            "{text}"
        );
        assert!(
            text.contains("rate=5000") && text.contains("round_trip_ms=4"),
            "{text}"
        );

        let before = captured.text().len();
        let mut fixed = Ahead::fixed(3);
        drive(&mut fixed, 3, 20, Duration::from_millis(4)).await;
        assert_eq!(
            captured.text().len(),
            before,
            "a fixed allowance never resizes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_allowance_never_moves() {
        let mut ahead = Ahead::fixed(3);
        drive(&mut ahead, 5, 100, Duration::from_millis(5)).await;
        assert_eq!(ahead.get(), 3);
    }
}
