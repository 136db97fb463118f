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
    /// The conditions themselves, for the probe.
    conditions: Vec<Expr>,
}

/// A cursor the probe looks behind: its key, conditions and position.
#[derive(Debug)]
pub(crate) struct Behind {
    pub(crate) key: String,
    pub(crate) conditions: Vec<Expr>,
    pub(crate) low: i64,
}

impl ClaimCursor {
    /// The id the next claim with `conditions` (named `key`) starts at, or
    /// `None` to scan from the start (a new set of conditions, or too many).
    pub(crate) fn start(&self, key: &str, conditions: &[Expr]) -> Option<i64> {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        let full = map.len() >= MAX_CURSORS;
        match map.get(key) {
            Some(p) if p.low > i64::MIN => Some(p.low),
            Some(_) => None,
            None if !full => {
                let first = Position {
                    low: i64::MIN,
                    conditions: conditions.to_vec(),
                };
                map.insert(key.to_owned(), first);
                None
            }
            None => None,
        }
    }

    /// A claim in id order with the conditions `key` returned rows up to
    /// `max_id`: every eligible row below it was claimed by it or held by
    /// another claim, so the next claim may start just past it.
    pub(crate) fn claimed_up_to(&self, key: &str, max_id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(key) {
            p.low = p.low.max(max_id.saturating_add(1));
        }
    }

    /// The job `id` went back to the queue from this store (a retry, a
    /// requeue, a reset): every claim starts at it again.
    pub(crate) fn rewind_to(&self, id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        for p in map.values_mut() {
            p.low = p.low.min(id);
        }
    }

    /// The probe found an eligible row `id` behind the cursor `key`.
    pub(crate) fn rewind_key(&self, key: &str, id: i64) {
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(key) {
            p.low = p.low.min(id);
        }
    }

    /// The cursors with something behind them to look at.
    pub(crate) fn behind(&self) -> Vec<Behind> {
        let map = self.by_conditions.lock().expect("not poisoned");
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
pub(crate) struct Probe(CancellationToken);

impl Probe {
    pub(crate) fn stop(&self) {
        self.0.cancel();
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.0.cancel();
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
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = task_stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let mut found = false;
            for b in cursor.behind() {
                let probe = sql::eligible_behind(&o, &b.conditions, b.low)
                    .query()
                    .fetch_one(&pool);
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
                        tracing::warn!(store = %o.name, error = %err, "the claim cursor's probe failed; claims go on from the cursor");
                    }
                }
            }
            if let (true, Some(waker)) = (found, &waker) {
                waker.wake();
            }
        }
    });
    Probe(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_start_past_what_they_took_and_go_back_when_told() {
        let cursor = ClaimCursor::default();
        assert_eq!(
            cursor.start("", &[]),
            None,
            "the first claim scans everything"
        );
        assert!(cursor.behind().is_empty(), "nothing behind a full scan");
        cursor.claimed_up_to("", 41);
        assert_eq!(cursor.start("", &[]), Some(42));
        cursor.claimed_up_to("", 10); // a slower claim that started earlier
        assert_eq!(
            cursor.start("", &[]),
            Some(42),
            "the cursor never moves back"
        );
        cursor.rewind_to(7);
        assert_eq!(cursor.start("", &[]), Some(7), "a retry takes it back");
        cursor.claimed_up_to("", 41);
        let behind = cursor.behind();
        assert_eq!((behind.len(), behind[0].low), (1, 42));
        cursor.rewind_key("", 30);
        assert_eq!(cursor.start("", &[]), Some(30), "the probe takes it back");
    }

    #[test]
    fn each_set_of_conditions_has_its_own_cursor() {
        let cursor = ClaimCursor::default();
        let emails = [Expr::cust("queue = 'emails'")];
        assert_eq!(cursor.start("emails", &emails), None);
        cursor.claimed_up_to("emails", 500);
        assert_eq!(
            cursor.start("reports", &[]),
            None,
            "another queue's claims never start past rows they did not see"
        );
        cursor.claimed_up_to("reports", 7);
        assert_eq!(cursor.start("emails", &emails), Some(501));
        assert_eq!(cursor.start("reports", &[]), Some(8));
        let behind = cursor.behind();
        let emails_behind = behind.iter().find(|b| b.key == "emails").unwrap();
        assert_eq!(emails_behind.conditions.len(), 1, "the probe uses them");
        cursor.rewind_key("reports", 3);
        assert_eq!(cursor.start("emails", &emails), Some(501));
        for i in 0..MAX_CURSORS {
            cursor.start(&format!("cost <= {i}"), &[]);
        }
        assert_eq!(cursor.start("one too many", &[]), None);
        cursor.claimed_up_to("one too many", 1);
        assert_eq!(
            cursor.start("one too many", &[]),
            None,
            "no cursor past the cap"
        );
    }
}
