//! The claim cursor: where a claim's index scan starts.
//!
//! Claimed rows leave the claim's partial index only when vacuum removes their
//! dead entries, and vacuum cannot while any transaction older than them is
//! open. A claim that scans from the table's first row then walks every one of
//! those entries (a heap visit each) before it finds a queued row, and slows
//! down as they pile up. The cursor remembers the lowest id that can still be
//! eligible for this store's claims, so they start there. What becomes
//! eligible behind it is found by a full pass, at least once per interval.
//!
//! Claims with different extra conditions (one worker per queue, kinds) see
//! different rows, so each set of conditions has a cursor of its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many condition sets get a cursor; claims with further ones (conditions
/// whose values change every call, say) always scan in full.
const MAX_CURSORS: usize = 256;

/// Where this store's next claims start, per set of claim conditions.
#[derive(Debug)]
pub(crate) struct ClaimCursor {
    full_pass_every: Duration,
    by_conditions: Mutex<HashMap<String, Position>>,
}

#[derive(Debug, Clone, Copy)]
struct Position {
    /// Every row below it was claimed, locked by another claim, not yet
    /// visible, or not eligible when a claim passed it.
    low: i64,
    /// When the last full pass started.
    last_full_pass: Instant,
}

impl ClaimCursor {
    pub(crate) fn new(full_pass_every: Duration) -> ClaimCursor {
        ClaimCursor {
            full_pass_every,
            by_conditions: Mutex::new(HashMap::new()),
        }
    }

    /// The id the next claim with `conditions` starts at, or `None` for a
    /// full pass (the first claim, and then one claim per interval).
    pub(crate) fn start(&self, conditions: &str) -> Option<i64> {
        let now = Instant::now();
        let mut map = self.by_conditions.lock().expect("not poisoned");
        let full = map.len() >= MAX_CURSORS;
        match map.get_mut(conditions) {
            Some(p) if now.duration_since(p.last_full_pass) < self.full_pass_every => Some(p.low),
            Some(p) => {
                p.last_full_pass = now;
                None
            }
            None if !full => {
                let first = Position {
                    low: i64::MIN,
                    last_full_pass: now,
                };
                map.insert(conditions.to_owned(), first);
                None
            }
            None => None,
        }
    }

    /// The job `id` went back to the queue from this store (a retry, a
    /// requeue): claims start at it again, so an immediate retry is not left
    /// for the next full pass.
    pub(crate) fn rewind_to(&self, id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        for p in map.values_mut() {
            p.low = p.low.min(id);
        }
    }

    /// A claim in id order with `conditions` returned rows up to `max_id`:
    /// every eligible row below it was claimed by it or held by another claim,
    /// so the next claim may start just past it.
    pub(crate) fn claimed_up_to(&self, conditions: &str, max_id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(conditions) {
            p.low = p.low.max(max_id.saturating_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_pass_comes_first_and_then_once_per_interval() {
        let cursor = ClaimCursor::new(Duration::from_secs(1));
        assert_eq!(cursor.start(""), None, "the first claim scans everything");
        cursor.claimed_up_to("", 41);
        assert_eq!(cursor.start(""), Some(42));
        cursor.claimed_up_to("", 10); // a slower claim that started earlier
        assert_eq!(cursor.start(""), Some(42), "the cursor never moves back");
        cursor.rewind_to(7);
        assert_eq!(cursor.start(""), Some(7), "a retry takes the cursor back");
        cursor.claimed_up_to("", 41);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(cursor.start(""), Some(42));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            cursor.start(""),
            None,
            "a full pass once the interval is up"
        );
        assert_eq!(cursor.start(""), Some(42));
    }

    #[tokio::test(start_paused = true)]
    async fn each_set_of_conditions_has_its_own_cursor() {
        let cursor = ClaimCursor::new(Duration::from_secs(1));
        assert_eq!(cursor.start("queue = 'emails'"), None);
        cursor.claimed_up_to("queue = 'emails'", 500);
        assert_eq!(
            cursor.start("queue = 'reports'"),
            None,
            "another queue's claims never start past rows they did not see"
        );
        cursor.claimed_up_to("queue = 'reports'", 7);
        assert_eq!(cursor.start("queue = 'emails'"), Some(501));
        assert_eq!(cursor.start("queue = 'reports'"), Some(8));
        for i in 0..MAX_CURSORS {
            cursor.start(&format!("cost <= {i}"));
        }
        assert_eq!(cursor.start("one too many"), None);
        cursor.claimed_up_to("one too many", 1);
        assert_eq!(cursor.start("one too many"), None, "no cursor past the cap");
    }
}
