//! A log consumer's checkpoint, under writers whose transactions interleave.
//!
//! **The real code.** `LogStore::open_slice` (`dbworker/src/consumers/store.rs`)
//! locks the consumer's assignment row (`sql::log_lock_assignment`, `FOR
//! UPDATE`: the slice's transaction gets an xid there), reads the checkpoint
//! (`sql::log_checkpoint`), and reads the next slice (`sql::log_slice`,
//! `sql/consumers.rs`); `LogStore::mark_complete` moves the checkpoint to the
//! last event read (`sql::log_advance`) in the same transaction. Events take
//! their position from a sequence when they are inserted, but become visible
//! when their transaction commits, in any order.
//!
//! - **The old rule** ([`Rule::Position`], before issue 25): the slice reads visible events with
//!   `position > checkpoint` in position order, and the checkpoint moves to the
//!   last position read. A transaction holding a lower position that commits
//!   after a higher one was read is skipped for good.
//! - **The rule the code follows** ([`Rule::XidHorizon`]): each event records its writer's
//!   top-level transaction id (`xid8`, assigned at the transaction's first
//!   write, increasing); the slice reads events with `(xid, position) >
//!   checkpoint` and `xid < pg_snapshot_xmin(pg_current_snapshot())` (the
//!   lowest xid still running, the slice's own included; if none, the next xid
//!   to be assigned), in `(xid, position)` order.
//! - [`Rule::XidOnly`]: the new order without the horizon, to show the horizon
//!   is what makes it safe.
//!
//! **The model.** Writers each run one transaction: it may take its xid
//! before writing an event (an earlier write to another table), inserts up to
//! `events_per_writer` events (each takes the next position), and commits or
//! rolls back. One consumer runs slices of at most `slice_size` events, one
//! after another (the assignment lock serializes a consumer's slices): a
//! slice takes an xid, then reads, handles and advances atomically (the read
//! and the horizon are one statement, one snapshot; the checkpoint is written
//! only by this consumer, so the rest of the slice's transaction races with
//! nothing). Consumers are independent of one another, so one is enough.
//! Xids are renumbered after every step, keeping their order, so the state
//! space stays finite although every slice takes a new xid. Bounds: the tests
//! run 2 writers × 2 events, 3 writers × 1 event and 3 writers × 2 events,
//! slices of 2.
//!
//! **Invariants.**
//! - `no event skipped`: an unhandled committed event is always still after the
//!   checkpoint (in the rule's order), so a later slice can read it.
//! - `no event handled twice`.
//! - `only committed events handled`: a rolled-back transaction's events never are.
//! - `all handled when quiet`: once every writer ended and the consumer's next
//!   slice would read nothing, every committed event was handled.
//! - `a lower position commits after a higher one was handled` (sometimes):
//!   the race that lost an event under the old rule is reached.

use crate::{Model, Property};

/// How a slice picks its events and moves the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The old rule: `position > checkpoint`, in position order.
    Position,
    /// `(xid, position) > checkpoint`, in that order, without the horizon.
    XidOnly,
    /// The new rule: `(xid, position) > checkpoint AND xid < snapshot xmin`.
    XidHorizon,
}

/// Where a writer's transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Writer {
    /// Running; `xid` once it wrote anything.
    Running {
        /// Its transaction id, once assigned.
        xid: Option<u8>,
        /// Events it inserted so far.
        written: u8,
    },
    /// Committed: its events are visible.
    Committed,
    /// Rolled back: its events never become visible.
    Aborted,
}

/// One inserted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// The writer's xid.
    pub xid: u8,
    /// Its position (from the sequence, at insert).
    pub position: u8,
    /// The writer (ghost: for visibility).
    pub writer: u8,
    /// Ghost: how many times the consumer handled it.
    pub handled: u8,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The writers.
    pub writers: Vec<Writer>,
    /// Every event inserted, committed or not, in insert order.
    pub events: Vec<Event>,
    /// The next xid to be assigned.
    pub next_xid: u8,
    /// The next position the sequence hands out.
    pub next_position: u8,
    /// The consumer's checkpoint: `(xid, position)` (the old rule reads only
    /// the position).
    pub checkpoint: (u8, u8),
    /// The xid of the consumer's open slice, if one is open.
    pub slice: Option<u8>,
    /// Ghost: an event committed below a position already handled.
    pub late_commit_seen: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The writer takes its xid by writing something else first.
    TakeXid(u8),
    /// The writer inserts an event (its xid is assigned now if not yet).
    Insert(u8),
    /// The writer commits.
    Commit(u8),
    /// The writer rolls back.
    Abort(u8),
    /// The consumer's slice begins and locks its assignment (takes an xid).
    BeginSlice,
    /// The slice reads, handles, advances the checkpoint and commits.
    ReadSlice,
}

/// The model: its bounds and rule.
#[derive(Debug, Clone)]
pub struct CheckpointModel {
    /// Writer transactions.
    pub writers: u8,
    /// Events each writer may insert.
    pub events_per_writer: u8,
    /// `LogOptions::slice_size`.
    pub slice_size: usize,
    /// The rule under test.
    pub rule: Rule,
}

impl CheckpointModel {
    /// Whether the event is after the checkpoint in the rule's order.
    fn after(&self, s: &State, e: &Event) -> bool {
        match self.rule {
            Rule::Position => e.position > s.checkpoint.1,
            Rule::XidOnly | Rule::XidHorizon => (e.xid, e.position) > s.checkpoint,
        }
    }

    /// The events the consumer's slice would read now (indexes into `events`),
    /// in reading order.
    fn slice(&self, s: &State) -> Vec<usize> {
        let running = s.writers.iter().filter_map(|w| match w {
            Writer::Running { xid, .. } => *xid,
            _ => None,
        });
        let xmin = running.chain(s.slice).min().unwrap_or(s.next_xid);
        let mut read: Vec<usize> = (0..s.events.len())
            .filter(|&i| {
                let e = &s.events[i];
                s.writers[usize::from(e.writer)] == Writer::Committed
                    && self.after(s, e)
                    && (self.rule != Rule::XidHorizon || e.xid < xmin)
            })
            .collect();
        match self.rule {
            Rule::Position => read.sort_by_key(|&i| s.events[i].position),
            _ => read.sort_by_key(|&i| (s.events[i].xid, s.events[i].position)),
        }
        read.truncate(self.slice_size);
        read
    }
}

/// Renumbers xids 1, 2, … in their order (0 stays "none"), so that states
/// differing only in how many xids were spent compare equal.
fn renumber(s: &mut State) {
    let mut used: Vec<u8> = s.events.iter().map(|e| e.xid).collect();
    used.extend(s.writers.iter().filter_map(|w| match w {
        Writer::Running { xid, .. } => *xid,
        _ => None,
    }));
    used.extend(s.slice);
    used.push(s.checkpoint.0);
    used.retain(|&x| x != 0);
    used.sort_unstable();
    used.dedup();
    let map = |x: u8| match used.binary_search(&x) {
        Ok(i) => u8::try_from(i + 1).expect("few xids"),
        Err(_) => 0,
    };
    for e in &mut s.events {
        e.xid = map(e.xid);
    }
    for w in &mut s.writers {
        if let Writer::Running { xid: Some(x), .. } = w {
            *x = map(*x);
        }
    }
    s.slice = s.slice.map(map);
    s.checkpoint.0 = map(s.checkpoint.0);
    s.next_xid = u8::try_from(used.len() + 1).expect("few xids");
}

impl Model for CheckpointModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            writers: vec![
                Writer::Running {
                    xid: None,
                    written: 0
                };
                usize::from(self.writers)
            ],
            events: Vec::new(),
            next_xid: 1,
            next_position: 1,
            checkpoint: (0, 0),
            slice: None,
            late_commit_seen: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, w) in (0u8..).zip(&s.writers) {
            if let Writer::Running { xid, written } = *w {
                if xid.is_none() {
                    actions.push(Action::TakeXid(i));
                }
                if written < self.events_per_writer {
                    actions.push(Action::Insert(i));
                }
                if written > 0 {
                    actions.push(Action::Commit(i));
                    actions.push(Action::Abort(i));
                }
            }
        }
        match s.slice {
            None => actions.push(Action::BeginSlice),
            // A slice that would read nothing is rolled back: no change.
            Some(_) if !self.slice(s).is_empty() => actions.push(Action::ReadSlice),
            Some(_) => {}
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::TakeXid(w) | Action::Insert(w) => {
                let Writer::Running { xid, written } = &mut n.writers[usize::from(w)] else {
                    return None;
                };
                let x = *xid.get_or_insert(n.next_xid);
                if x == n.next_xid {
                    n.next_xid += 1;
                }
                if action == Action::Insert(w) {
                    *written += 1;
                    n.events.push(Event {
                        xid: x,
                        position: n.next_position,
                        writer: w,
                        handled: 0,
                    });
                    n.next_position += 1;
                }
            }
            Action::Commit(w) => {
                n.writers[usize::from(w)] = Writer::Committed;
                let highest = s
                    .events
                    .iter()
                    .filter(|e| e.handled > 0)
                    .map(|e| e.position)
                    .max();
                n.late_commit_seen |= s
                    .events
                    .iter()
                    .any(|e| e.writer == w && highest.is_some_and(|h| e.position < h));
            }
            Action::Abort(w) => n.writers[usize::from(w)] = Writer::Aborted,
            Action::BeginSlice => {
                n.slice = Some(n.next_xid);
                n.next_xid += 1;
            }
            Action::ReadSlice => {
                let read = self.slice(s);
                let last = s.events[*read.last()?];
                for i in read {
                    n.events[i].handled += 1;
                }
                let xid = if self.rule == Rule::Position {
                    0
                } else {
                    last.xid
                };
                n.checkpoint = (xid, last.position);
                n.slice = None;
            }
        }
        renumber(&mut n);
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no event skipped", |m: &Self, s: &State| {
                s.events.iter().all(|e| {
                    s.writers[usize::from(e.writer)] != Writer::Committed
                        || e.handled > 0
                        || m.after(s, e)
                })
            }),
            Property::always("no event handled twice", |_, s: &State| {
                s.events.iter().all(|e| e.handled <= 1)
            }),
            Property::always("only committed events handled", |_, s: &State| {
                s.events.iter().all(|e| {
                    e.handled == 0 || s.writers[usize::from(e.writer)] == Writer::Committed
                })
            }),
            Property::always("all handled when quiet", |m: &Self, s: &State| {
                let quiet = s.slice.is_none()
                    && s.writers
                        .iter()
                        .all(|w| !matches!(w, Writer::Running { .. }))
                    && m.slice(s).is_empty();
                !quiet
                    || s.events.iter().all(|e| {
                        e.handled == 1 || s.writers[usize::from(e.writer)] != Writer::Committed
                    })
            }),
            Property::sometimes(
                "a lower position commits after a higher one was handled",
                |_, s: &State| s.late_commit_seen,
            ),
        ]
    }
}
