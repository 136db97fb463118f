//! The claim cursor: where a claim's index scan starts.
//!
//! Claimed rows leave the claim's partial index only when vacuum removes their
//! dead entries, and vacuum cannot while any transaction older than them is
//! open. A claim that scans from the table's first row then walks every one of
//! those entries (a heap visit each) before it finds a queued row, and slows
//! down as they pile up. The cursor remembers the lowest id that can still be
//! eligible for this store's claims, so they start there.
//!
//! What becomes eligible behind it (a scheduled job coming due, a reset by
//! another process, an insert that committed late) is found by a probe that
//! runs beside the claims, once per interval, and takes the cursor back: the
//! walk over the dead entries happens there, off the claims' path.
//!
//! Claims with different extra conditions (one worker per queue, kinds) see
//! different rows, so each set of conditions has a cursor of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_query::Expr;
use sqlx::{PgPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workerutil::WakeupSender;

use crate::sql;
use crate::store::Resolved;

/// How many condition sets get a cursor; claims with further ones (conditions
/// whose values change every call, say) always scan in full.
const MAX_CURSORS: usize = 256;

/// Where this store's next claims start, per set of claim conditions.
#[derive(Debug, Default)]
pub(crate) struct ClaimCursor {
    by_conditions: Mutex<HashMap<String, Position>>,
}

#[derive(Debug, Clone)]
struct Position {
    /// Every row below it was claimed, locked by another claim, not yet
    /// visible, or not eligible when a claim passed it.
    low: i64,
    /// Counts the rewinds: a claim that started before one must not move the
    /// cursor past the row it was taken back for.
    epoch: u64,
    /// The conditions themselves, for the probe.
    conditions: Vec<Expr>,
    /// When a claim last used it; idle cursors are dropped.
    used: Instant,
}

impl Position {
    fn rewind(&mut self, id: i64) {
        self.low = self.low.min(id);
        self.epoch += 1;
    }
}

/// Where a claim started: its position, and the cursor's epoch then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// `None`: from the table's first row.
    pub(crate) low: Option<i64>,
    epoch: u64,
}

/// A cursor the probe looks behind: its key, conditions and position.
#[derive(Debug)]
pub(crate) struct Behind {
    pub(crate) key: String,
    pub(crate) conditions: Vec<Expr>,
    pub(crate) low: i64,
}

impl ClaimCursor {
    /// Where the next claim with `conditions` (named `key`) starts: past the
    /// cursor, or from the start (a new set of conditions, or too many).
    pub(crate) fn start(&self, key: &str, conditions: &[Expr]) -> Start {
        let now = Instant::now();
        let mut map = self.by_conditions.lock().expect("not poisoned");
        let full = map.len() >= MAX_CURSORS;
        if let Some(p) = map.get_mut(key) {
            p.used = now;
            let low = (p.low > i64::MIN).then_some(p.low);
            return Start {
                low,
                epoch: p.epoch,
            };
        }
        if !full {
            let first = Position {
                low: i64::MIN,
                epoch: 0,
                conditions: conditions.to_vec(),
                used: now,
            };
            map.insert(key.to_owned(), first);
        }
        Start {
            low: None,
            epoch: 0,
        }
    }

    /// A claim in id order with the conditions `key`, started at `start`,
    /// returned rows up to `max_id`: every eligible row below it was claimed
    /// by it or held by another claim, so the next claim may start just past
    /// it, unless the cursor was taken back meanwhile.
    pub(crate) fn claimed_up_to(&self, key: &str, start: Start, max_id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(key)
            && p.epoch == start.epoch
        {
            p.low = p.low.max(max_id.saturating_add(1));
        }
    }

    /// The job `id` went back to the queue from this store (a retry, a
    /// requeue, a reset): every claim starts at it again.
    pub(crate) fn rewind_to(&self, id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        for p in map.values_mut() {
            p.rewind(id);
        }
    }

    /// The probe found an eligible row `id` behind the cursor `key`.
    pub(crate) fn rewind_key(&self, key: &str, id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(key) {
            p.rewind(id);
        }
    }

    /// The probe could not look: the next claims scan from the start, so
    /// nothing behind a cursor waits for a probe that may not come.
    pub(crate) fn rewind_all(&self) {
        self.rewind_to(i64::MIN);
    }

    /// The cursors with something behind them to look at, forgetting those
    /// no claim used for `idle` (conditions whose values changed, say).
    pub(crate) fn behind(&self, idle: Duration) -> Vec<Behind> {
        let now = Instant::now();
        let mut map = self.by_conditions.lock().expect("not poisoned");
        map.retain(|_, p| now.duration_since(p.used) < idle);
        map.iter()
            .filter(|(_, p)| p.low > i64::MIN)
            .map(|(key, p)| Behind {
                key: key.clone(),
                conditions: p.conditions.clone(),
                low: p.low,
            })
            .collect()
    }
}

/// The probe task; it stops when this is dropped or stopped.
#[derive(Debug)]
pub(crate) struct Probe {
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Probe {
    /// Stops the probe and waits until it has.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().expect("not poisoned").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the probe: every `every`, for each cursor, the lowest eligible row
/// behind it (with its claims' conditions) takes it back, and the workers are
/// woken (`waker`, when the store listens) to claim it.
pub(crate) fn spawn_probe(
    pool: PgPool,
    o: Arc<Resolved>,
    cursor: Arc<ClaimCursor>,
    every: Duration,
    waker: Option<Arc<WakeupSender>>,
) -> Probe {
    let stop = CancellationToken::new();
    let task_stop = stop.clone();
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = task_stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let behind = cursor.behind(every.saturating_mul(10));
            if behind.is_empty() {
                continue;
            }
            // Only an idle connection: the pool is sized for the handlers,
            // claims and heartbeats. With none free the claims scan in full.
            let Some(mut conn) = pool.try_acquire() else {
                cursor.rewind_all();
                continue;
            };
            let mut found = false;
            for b in behind {
                let probe = sql::eligible_behind(&o, &b.conditions, b.low)
                    .query()
                    .fetch_one(&mut *conn);
                let row = tokio::select! {
                    _ = task_stop.cancelled() => return,
                    row = probe => row,
                };
                match row {
                    Ok(row) => {
                        if let Some(id) = row.get::<Option<i64>, _>("id") {
                            cursor.rewind_key(&b.key, id);
                            found = true;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(store = %o.name, error = %err, "the claim cursor's probe failed; claims scan from the start");
                        cursor.rewind_all();
                    }
                }
            }
            drop(conn);
            if let (true, Some(waker)) = (found, &waker) {
                waker.wake();
            }
        }
    });
    Probe {
        stop,
        task: Mutex::new(Some(task)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn low(cursor: &ClaimCursor, key: &str) -> Option<i64> {
        cursor.start(key, &[]).low
    }

    #[tokio::test(start_paused = true)]
    async fn claims_start_past_what_they_took_and_go_back_when_told() {
        let cursor = ClaimCursor::default();
        let first = cursor.start("", &[]);
        assert_eq!(first.low, None, "the first claim scans everything");
        assert!(
            cursor.behind(Duration::from_secs(10)).is_empty(),
            "nothing behind a full scan"
        );
        cursor.claimed_up_to("", first, 41);
        assert_eq!(low(&cursor, ""), Some(42));
        let slow = cursor.start("", &[]);
        cursor.claimed_up_to("", slow, 10); // a slower claim that started earlier
        assert_eq!(low(&cursor, ""), Some(42), "the cursor never moves back");
        cursor.rewind_to(7);
        assert_eq!(low(&cursor, ""), Some(7), "a retry takes it back");
        cursor.claimed_up_to("", cursor.start("", &[]), 41);
        let behind = cursor.behind(Duration::from_secs(10));
        assert_eq!((behind.len(), behind[0].low), (1, 42));
        cursor.rewind_key("", 30);
        assert_eq!(low(&cursor, ""), Some(30), "the probe takes it back");
        cursor.rewind_all();
        assert_eq!(low(&cursor, ""), None, "no probe: scan from the start");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_in_flight_during_a_rewind_does_not_undo_it() {
        let cursor = ClaimCursor::default();
        cursor.claimed_up_to("", cursor.start("", &[]), 999);
        let in_flight = cursor.start("", &[]);
        assert_eq!(in_flight.low, Some(1000));
        cursor.rewind_key("", 50); // the probe found row 50
        cursor.claimed_up_to("", in_flight, 1015);
        assert_eq!(
            low(&cursor, ""),
            Some(50),
            "row 50 is still ahead of the claims"
        );
        cursor.claimed_up_to("", cursor.start("", &[]), 1030);
        assert_eq!(low(&cursor, ""), Some(1031));
    }

    #[tokio::test(start_paused = true)]
    async fn each_set_of_conditions_has_its_own_cursor_and_idle_ones_go() {
        let cursor = ClaimCursor::default();
        let emails = [Expr::cust("queue = 'emails'")];
        let s = cursor.start("emails", &emails);
        assert_eq!(s.low, None);
        cursor.claimed_up_to("emails", s, 500);
        let r = cursor.start("reports", &[]);
        assert_eq!(
            r.low, None,
            "another queue's claims never start past rows they did not see"
        );
        cursor.claimed_up_to("reports", r, 7);
        assert_eq!(cursor.start("emails", &emails).low, Some(501));
        assert_eq!(low(&cursor, "reports"), Some(8));
        let behind = cursor.behind(Duration::from_secs(10));
        let emails_behind = behind.iter().find(|b| b.key == "emails").unwrap();
        assert_eq!(emails_behind.conditions.len(), 1, "the probe uses them");
        cursor.rewind_key("reports", 3);
        assert_eq!(cursor.start("emails", &emails).low, Some(501));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(low(&cursor, "reports"), Some(3));
        tokio::time::advance(Duration::from_secs(6)).await;
        let behind = cursor.behind(Duration::from_secs(10));
        assert_eq!(behind.len(), 1, "emails went idle: {behind:?}");
        assert_eq!(behind[0].key, "reports");
        for i in 0..MAX_CURSORS {
            cursor.start(&format!("cost <= {i}"), &[]);
        }
        let s = cursor.start("one too many", &[]);
        assert_eq!(s.low, None);
        cursor.claimed_up_to("one too many", s, 1);
        assert_eq!(low(&cursor, "one too many"), None, "no cursor past the cap");
    }
}
