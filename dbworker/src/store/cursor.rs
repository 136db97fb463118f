//! The claim cursor: where a claim's index scan starts.
//!
//! Claimed rows leave the claim's partial index only when vacuum removes their
//! dead entries, and vacuum cannot while any transaction older than them is
//! open. A claim that scans from the table's first row then walks every one of
//! those entries (a heap visit each) before it finds a queued row, and slows
//! down as they pile up. The cursor remembers the lowest id that can still be
//! eligible for this store's claims, so they start there.
//!
//! What becomes eligible behind it takes it back: at once when the store
//! learns the row's id (its own retries and requeues; with LISTEN, the NOTIFY
//! trigger's id of a requeued row and the lowest id of each INSERT, so a job
//! whose insert commits after a claim passed its id is not left behind), and
//! otherwise at the next look of the probe (`store/probe.rs`).
//!
//! Claims with different extra conditions (one worker per queue, kinds) see
//! different rows, so each set of conditions has a cursor of its own. The
//! probe looks for each set in use, which is one whose claims come about as
//! often as they did before: a worker that backs off to a claim every 30 s
//! keeps its cursor looked after between them (jobs coming due wake it).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_query::Expr;
use tokio::time::Instant;

/// How many condition sets get a cursor; a further one takes the place of
/// the one used longest ago (conditions whose values change every call, say,
/// make a cursor each and scan in full, while steady ones keep theirs).
const MAX_CURSORS: usize = 256;

/// A cursor no claim used for this long (or three times its last gap between
/// claims, when longer) is out of use: the probe leaves it, and its next
/// claim scans from the start, since nothing looked behind it meanwhile. At
/// least ten probe intervals.
const IDLE_AFTER: Duration = Duration::from_secs(60);

/// How many rewinds a cursor remembers for the claims in flight (with
/// LISTEN, every insert statement anywhere is one; 256 cover a few hundred
/// milliseconds of a busy table). A claim that started before the oldest one
/// kept leaves the cursor where it is.
const KEPT_REWINDS: usize = 256;

/// Where this store's next claims start, per set of claim conditions.
#[derive(Debug)]
pub(crate) struct ClaimCursor {
    by_conditions: Mutex<HashMap<String, Position>>,
    /// Out of use after this long without a claim (see [`IDLE_AFTER`]).
    idle: Duration,
    /// Whether claims move it; if not, every claim scans from the start and
    /// the conditions are kept only for the probe.
    positions: bool,
    /// Numbers each cursor made, so a claim that started on an evicted one
    /// moves nothing on the one made anew for its conditions.
    made: AtomicU64,
}

#[derive(Debug, Clone)]
struct Position {
    /// Every row below it was claimed, locked by another claim, not yet
    /// visible, or not eligible when a claim passed it.
    low: i64,
    /// Counts the rewinds: a claim that started before one must not move the
    /// cursor past the row it was taken back for.
    epoch: u64,
    /// Recent rewinds as (epoch after it, id), both rising towards the back:
    /// a later rewind to a lower id stands for every earlier one above it.
    rewinds: VecDeque<(u64, i64)>,
    /// Claims that started before this epoch may have passed a rewind no
    /// longer kept.
    forgotten: u64,
    /// The conditions themselves, for the probe.
    conditions: Vec<Expr>,
    /// When a claim last used it, and the gap before that use.
    used: Instant,
    gap: Duration,
    /// Which cursor made for these conditions this is.
    made: u64,
}

impl Position {
    fn new(conditions: &[Expr], now: Instant, made: u64) -> Self {
        Position {
            low: i64::MIN,
            epoch: 0,
            rewinds: VecDeque::new(),
            forgotten: 0,
            conditions: conditions.to_vec(),
            used: now,
            gap: Duration::ZERO,
            made,
        }
    }

    /// Whether claims still use it at `now`: within `idle` of the last one,
    /// or within three times the gap before it (a worker backing off doubles
    /// its wait each time).
    fn in_use(&self, now: Instant, idle: Duration) -> bool {
        now.duration_since(self.used) < idle.max(self.gap.saturating_mul(3))
    }

    fn rewind(&mut self, id: i64) {
        self.low = self.low.min(id);
        self.epoch += 1;
        while self.rewinds.back().is_some_and(|&(_, r)| r >= id) {
            self.rewinds.pop_back();
        }
        self.rewinds.push_back((self.epoch, id));
        if self.rewinds.len() > KEPT_REWINDS
            && let Some((epoch, _)) = self.rewinds.pop_front()
        {
            self.forgotten = epoch;
        }
    }

    /// The lowest id the cursor was taken back to after `epoch`: a claim that
    /// started then may have passed that row without seeing it.
    fn rewound_since(&self, epoch: u64) -> Option<i64> {
        let first = self.rewinds.partition_point(|&(e, _)| e <= epoch);
        self.rewinds.get(first).map(|&(_, id)| id)
    }
}

/// Where a claim started: its position, and the cursor's epoch then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// `None`: from the table's first row.
    pub(crate) low: Option<i64>,
    epoch: u64,
    made: u64,
}

/// A cursor in use, for the probe: its key, conditions and position.
#[derive(Debug)]
pub(crate) struct InUse {
    pub(crate) key: String,
    pub(crate) conditions: Vec<Expr>,
    /// `None`: its claims scan from the start.
    pub(crate) low: Option<i64>,
}

impl ClaimCursor {
    /// Cursors for a store whose probe looks every `probe`; without
    /// `positions` (claims not in id order, or a pause table) they only keep
    /// each set's conditions for the probe, and claims scan from the start.
    pub(crate) fn new(probe: Duration, positions: bool) -> Self {
        ClaimCursor {
            by_conditions: Mutex::default(),
            idle: IDLE_AFTER.max(probe.saturating_mul(10)),
            positions,
            made: AtomicU64::new(0),
        }
    }

    /// Where the next claim with `conditions` (named `key`) starts: past the
    /// cursor, or from the start (a new set of conditions, or one out of use
    /// that the probe stopped looking behind).
    pub(crate) fn start(&self, key: &str, conditions: &[Expr]) -> Start {
        let now = Instant::now();
        let mut map = self.by_conditions.lock().expect("not poisoned");
        if let Some(p) = map.get_mut(key) {
            if p.in_use(now, self.idle) {
                p.gap = now.duration_since(p.used);
            } else {
                // Rows may have become eligible behind it unseen: back to
                // the start, as a rewind, so no claim in flight undoes it.
                // A claim now and then is no back-off to keep it in use for.
                p.rewind(i64::MIN);
                p.gap = Duration::ZERO;
            }
            p.used = now;
            let low = (p.low > i64::MIN).then_some(p.low);
            return Start {
                low,
                epoch: p.epoch,
                made: p.made,
            };
        }
        if map.len() >= MAX_CURSORS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, p)| p.used)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        let made = self.made.fetch_add(1, Ordering::Relaxed);
        map.insert(key.to_owned(), Position::new(conditions, now, made));
        Start {
            low: None,
            epoch: 0,
            made,
        }
    }

    /// A claim in id order with the conditions `key`, started at `start`,
    /// returned rows up to `max_id`: every eligible row below it was claimed
    /// by it or held by another claim, so the next claim may start just past
    /// it, though never past a row the cursor was taken back for meanwhile
    /// (it may have committed after the claim's snapshot).
    pub(crate) fn claimed_up_to(&self, key: &str, start: Start, max_id: i64) {
        if !self.positions {
            return;
        }
        let mut map = self.by_conditions.lock().expect("not poisoned");
        let Some(p) = map.get_mut(key) else { return };
        // Started on a cursor since evicted and made anew, or before
        // the oldest rewind kept: it may have passed a row it did not see.
        if start.made != p.made || start.epoch < p.forgotten {
            return;
        }
        let mut past = max_id.saturating_add(1);
        if let Some(id) = p.rewound_since(start.epoch) {
            past = past.min(id);
        }
        p.low = p.low.max(past);
    }

    /// The job `id` became eligible (this store's retry, requeue or reset, or
    /// a notification's id): every claim starts at it again.
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

    /// The cursors claims still use (see [`IDLE_AFTER`]).
    pub(crate) fn in_use(&self) -> Vec<InUse> {
        let now = Instant::now();
        let map = self.by_conditions.lock().expect("not poisoned");
        map.iter()
            .filter(|(_, p)| p.in_use(now, self.idle))
            .map(|(key, p)| InUse {
                key: key.clone(),
                conditions: p.conditions.clone(),
                low: (p.low > i64::MIN).then_some(p.low),
            })
            .collect()
    }
}

impl<R: workerutil::Record> super::DbStore<R> {
    /// The job `id` is going back to the queue: this store's claims look at
    /// it again (see the cursor above).
    pub(super) fn back_in_queue(&self, id: i64) {
        if let Some(cursor) = &self.cursor {
            cursor.rewind_to(id);
        }
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
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
        let first = cursor.start("", &[]);
        assert_eq!(first.low, None, "the first claim scans everything");
        let in_use = cursor.in_use();
        assert_eq!((in_use.len(), in_use[0].low), (1, None), "a full scan");
        cursor.claimed_up_to("", first, 41);
        assert_eq!(low(&cursor, ""), Some(42));
        let slow = cursor.start("", &[]);
        cursor.claimed_up_to("", slow, 10); // a slower claim that started earlier
        assert_eq!(low(&cursor, ""), Some(42), "the cursor never moves back");
        cursor.rewind_to(7);
        assert_eq!(low(&cursor, ""), Some(7), "a retry takes it back");
        cursor.claimed_up_to("", cursor.start("", &[]), 41);
        let in_use = cursor.in_use();
        assert_eq!((in_use.len(), in_use[0].low), (1, Some(42)));
        cursor.rewind_key("", 30);
        assert_eq!(low(&cursor, ""), Some(30), "the probe takes it back");
        cursor.rewind_all();
        assert_eq!(low(&cursor, ""), None, "no probe: scan from the start");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_in_flight_during_a_rewind_does_not_undo_it() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
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

    /// Inserts announce their ids while claims are in flight: a claim stops
    /// at the lowest id announced since it started (its snapshot may predate
    /// that row's commit), yet the cursor keeps moving under a steady stream.
    #[tokio::test(start_paused = true)]
    async fn a_claim_in_flight_stops_at_ids_announced_since_it_started() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
        cursor.claimed_up_to("", cursor.start("", &[]), 999);
        let in_flight = cursor.start("", &[]);
        cursor.rewind_to(1010); // ahead of the cursor: no rewind, but noted
        assert_eq!(low(&cursor, ""), Some(1000));
        let later = cursor.start("", &[]);
        cursor.rewind_to(2000);
        cursor.claimed_up_to("", in_flight, 1015);
        assert_eq!(low(&cursor, ""), Some(1010), "1010 may be unseen");
        cursor.claimed_up_to("", later, 1020);
        assert_eq!(low(&cursor, ""), Some(1021), "2000 is past this claim");

        // More announcements than are kept while one claim is in flight:
        // that claim moves nothing; the claims after it move on.
        let in_flight = cursor.start("", &[]);
        cursor.rewind_to(1500);
        for id in 3000..3000 + 2 * KEPT_REWINDS as i64 {
            cursor.rewind_to(id);
        }
        let later = cursor.start("", &[]);
        cursor.rewind_to(3100);
        cursor.claimed_up_to("", in_flight, 4000);
        assert_eq!(low(&cursor, ""), Some(1021), "it may have passed 1500");
        cursor.claimed_up_to("", later, 4000);
        assert_eq!(
            low(&cursor, ""),
            Some(3100),
            "a lower id stands for later ones"
        );
        cursor.claimed_up_to("", cursor.start("", &[]), 4000);
        assert_eq!(low(&cursor, ""), Some(4001));
    }

    #[tokio::test(start_paused = true)]
    async fn each_set_of_conditions_has_its_own_cursor() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
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
        let in_use = cursor.in_use();
        let emails_in_use = in_use.iter().find(|b| b.key == "emails").unwrap();
        assert_eq!(emails_in_use.conditions.len(), 1, "the probe uses them");
        cursor.rewind_key("reports", 3);
        assert_eq!(cursor.start("emails", &emails).low, Some(501));
        assert_eq!(low(&cursor, "reports"), Some(3));
    }

    /// A cursor stays in use for a minute without claims, or three times
    /// its last gap: a worker backing off to a claim every 128 s keeps it
    /// looked after. One out of use is left by the probe, and its next claim
    /// scans from the start.
    #[tokio::test(start_paused = true)]
    async fn a_cursor_stays_in_use_while_its_claims_back_off() {
        let secs = Duration::from_secs;
        let cursor = ClaimCursor::new(secs(1), true);
        let in_use = |key: &str| cursor.in_use().iter().any(|c| c.key == key);
        cursor.claimed_up_to("backs off", cursor.start("backs off", &[]), 99);
        cursor.claimed_up_to("goes idle", cursor.start("goes idle", &[]), 99);
        for gap in [1, 2, 4, 8, 16, 32, 64, 128] {
            tokio::time::advance(secs(gap) - Duration::from_millis(1)).await;
            assert!(in_use("backs off"), "before the claim {gap} s later");
            tokio::time::advance(Duration::from_millis(1)).await;
            assert_eq!(low(&cursor, "backs off"), Some(100));
        }
        assert!(!in_use("goes idle"), "no claim for 255 s");
        assert_eq!(low(&cursor, "goes idle"), None, "scans from the start");
        assert!(in_use("goes idle"), "in use again");
        tokio::time::advance(secs(128 * 3)).await;
        assert!(!in_use("backs off"), "three times its last gap");
        // A claim after it went out of use is no back-off: the gap before it
        // keeps nothing in use.
        assert_eq!(low(&cursor, "backs off"), None);
        tokio::time::advance(secs(60)).await;
        assert!(!in_use("backs off"), "a minute after a claim now and then");
    }

    /// A claim that started on a cursor since evicted moves nothing on the
    /// one made anew for its conditions, which may have been taken back
    /// meanwhile for a row that claim never saw.
    #[tokio::test(start_paused = true)]
    async fn a_claim_on_an_evicted_cursor_moves_nothing() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
        let in_flight = cursor.start("old", &[]);
        for i in 0..MAX_CURSORS {
            tokio::time::advance(Duration::from_millis(1)).await;
            cursor.start(&format!("cost <= {i}"), &[]);
        }
        let anew = cursor.start("old", &[]);
        assert_eq!(anew.low, None, "evicted, and made anew");
        cursor.claimed_up_to("old", in_flight, 500);
        assert_eq!(low(&cursor, "old"), None, "the evicted cursor's claim");
        cursor.claimed_up_to("old", anew, 500);
        assert_eq!(low(&cursor, "old"), Some(501));
    }

    /// Without positions (claims not in id order, a pause table), claims
    /// always scan from the start; their conditions are kept for the probe.
    #[tokio::test(start_paused = true)]
    async fn without_positions_claims_scan_from_the_start_and_the_probe_sees_them() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), false);
        let emails = [Expr::cust("queue = 'emails'")];
        cursor.claimed_up_to("emails", cursor.start("emails", &emails), 500);
        assert_eq!(cursor.start("emails", &emails).low, None);
        cursor.rewind_to(7);
        assert_eq!(cursor.start("emails", &emails).low, None);
        let in_use = cursor.in_use();
        assert_eq!(in_use.len(), 1);
        assert_eq!((in_use[0].low, in_use[0].conditions.len()), (None, 1));
    }

    /// Past the cap, a new set of conditions takes the place of the one used
    /// longest ago, so steady claims keep their cursors among changing ones.
    #[tokio::test(start_paused = true)]
    async fn past_the_cap_a_new_cursor_replaces_the_one_used_longest_ago() {
        let cursor = ClaimCursor::new(Duration::from_secs(1), true);
        cursor.claimed_up_to("steady", cursor.start("steady", &[]), 9);
        for i in 0..MAX_CURSORS {
            tokio::time::advance(Duration::from_millis(1)).await;
            let key = format!("cost <= {i}");
            cursor.claimed_up_to(&key, cursor.start(&key, &[]), 1);
            if i % 100 == 0 {
                assert_eq!(low(&cursor, "steady"), Some(10));
            }
        }
        assert_eq!(cursor.in_use().len(), MAX_CURSORS);
        assert_eq!(low(&cursor, "steady"), Some(10), "used recently: kept");
        assert_eq!(low(&cursor, "cost <= 0"), None, "the oldest went");
        assert_eq!(low(&cursor, "cost <= 255"), Some(2));
    }
}
