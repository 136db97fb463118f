//! How the dequeue loop waits: the idle back-off between empty claims, and
//! sleeping until an optional deadline.

use std::time::Duration;

use tokio::time::Instant;

/// The idle wait between empty dequeues: `interval`, doubling up to
/// `max_interval` while nothing is found.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Option<Duration>) -> Self {
        Backoff {
            base,
            max: max.unwrap_or(base),
            next: base,
        }
    }

    /// The wait after an empty dequeue. `live`: whether the store's wake-ups
    /// flow (`None`: it has none). Without live wake-ups from a store that has
    /// them, stay at the base interval: polling is all there is.
    pub(crate) fn idle(&mut self, live: Option<bool>) -> Duration {
        let cap = if live == Some(false) {
            self.base
        } else {
            self.max
        };
        let wait = self.next.min(cap);
        self.next = (wait * 2).min(cap);
        wait
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.base;
    }
}

/// Sleeps until `deadline`; never wakes without one.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_back_off_doubles_to_its_cap_and_stays_at_the_interval_without_live_wake_ups() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), Some(s(8)));
        let waits: Vec<u64> = (0..6).map(|_| b.idle(Some(true)).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
        // The listener is down: polling is all there is.
        assert_eq!(b.idle(Some(false)), s(1));
        b.reset();
        assert_eq!(b.idle(None), s(1));
        assert_eq!(b.idle(None), s(2));
        // Without max_interval there is no back-off.
        let mut flat = Backoff::new(s(1), None);
        assert_eq!(flat.idle(Some(true)), s(1));
        assert_eq!(flat.idle(Some(true)), s(1));
    }
}
