//! Progress reported through heartbeats beside the attempt's own fenced
//! writes: no beat writes for a lost claim, no owner's write is refused as
//! stale, no older report lands over a newer value, no last report is lost.
//!
//! **The real code.** `store/progress.rs`: `report_progress` puts the value
//! in the store's `Pending`, per job: `value` (the latest report no beat took),
//! `in_flight` (the one a beat carries), `counted_by_beats` (the beats'
//! writes the attempt has not counted yet) and `writing` (an own write is on
//! its way). A heartbeat (`store/heartbeat.rs`) takes `value` unless a beat
//! already carries one or the attempt is writing; its statement
//! (`sql/heartbeat.rs`, the side table's `heartbeat_side` in
//! `sql/progress_table.rs`) writes it to the row and counts the write in
//! `progress_seq`. When the beat returns, `returned` counts a written value
//! and gives back one not written (the beat failed, or skipped the row,
//! locked by its handler's transaction) unless a newer one was reported. The
//! attempt's own writes (`set_progress`, which drops the unsent report it
//! supersedes; `save_checkpoint`, which keeps it) run `start_write`: they
//! wait until no beat carries its report, add the beats' count to the count
//! they name (`progress_seq = $s`, see [`progress`](crate::progress)), and
//! hold beats off until they return. The final mark writes the report no beat
//! wrote (`last`, after the same wait), fenced by the token, any count. The
//! beat's statement reads the rows it owns in its snapshot (`dbworker_owned`:
//! `processing`, `(id, token)` among the leases), then locks them (`FOR NO
//! KEY UPDATE SKIP LOCKED`), which re-evaluates the lock query's own `WHERE`
//! on the row's newest version: it names the state and `(id, token)` again.
//!
//! **The model.** One job. Attempt 1 (token 1, on the worker whose beats are
//! modelled) runs [`PROGRAM`]; a report and each `Pending` step are atomic
//! (its mutex); an own write is two steps (`start_write`, then the statement
//! lands and returns); the final mark is one (`last`, then the last report
//! written with the mark; a mark other than a completion or a wait writes it
//! just before, on its own, but with the entry gone and no beat carrying a
//! report, nothing but a reset comes between, the same as a reset before).
//! One beat at a time (the heartbeat loop): it takes the report and reads
//! its snapshot, then its lock step writes the row or the beat writes
//! nothing, then it returns. The resetter may requeue the job once while
//! attempt 1 runs; the next claim (token 2) starts attempt 2, on another
//! worker, which reads the count and writes progress once. Values grow in
//! program order (attempt 2's is the largest), so a value landing below the
//! row's is an older one.
//!
//! **Invariants.** `no beat writes for an attempt that lost its claim`, `no
//! write of the owner is refused as stale`, `no older report lands over a
//! newer value`; at the end, `the last report reaches the row` when attempt
//! 1's mark was accepted. Sometimes: `a beat writes a report`, `a beat finds
//! the claim gone under its lock`, `a report a beat missed goes back`, `an own
//! write counts a beat's write`, `the final mark writes the last report`,
//! `the new attempt writes`.
//!
//! **Guards removed**, one flag each (all `true` is the real code):
//! [`BeatsModel::recheck_lock`] `false` locks by `id IN (owned)` only (the
//! old statement): a reset (and a new claim) between the snapshot and the
//! lock let the beat write the old attempt's report, and the count it adds
//! refuses the new owner's write. [`BeatsModel::count_beats`]:
//! the next own write names a count the beats moved on, and is refused.
//! [`BeatsModel::wait_for_beats`]: the beat lands after the own write, an
//! older report over it (or first, and the own write is refused).
//! [`BeatsModel::hold_while_writing`]: a beat takes the report a checkpoint
//! write kept and lands first; the checkpoint is refused.
//! [`BeatsModel::give_back`]: a report a beat missed is dropped, and the last
//! report never reaches the row. [`BeatsModel::abandon`] is no guard: the
//! heartbeat loop gives a beat up after its interval (`tokio::time::timeout`
//! in `workerutil/src/heartbeat.rs`) and `returned` treats it as failed,
//! though its statement may still commit.

use crate::{Model, Property};

/// One step of attempt 1's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `report_progress(v)`.
    Report(u8),
    /// `set_progress(v)`: a fenced write of a newer value.
    SetProgress(u8),
    /// `save_checkpoint`: a fenced write that leaves progress (and the
    /// unsent report) as they are.
    Checkpoint,
    /// The final mark, with the last report no beat wrote.
    Finish,
}

/// Attempt 1's handler: two reports in a row (the second replaces the
/// first), a write superseding them, a report a checkpoint write keeps, the end.
pub const PROGRAM: [Op; 6] = [
    Op::Report(1),
    Op::Report(2),
    Op::SetProgress(3),
    Op::Report(4),
    Op::Checkpoint,
    Op::Finish,
];

/// The last value attempt 1 reports or writes.
const LAST: u8 = 4;

/// Attempt 2's one write, above every value of attempt 1.
const SECOND_VALUE: u8 = 9;

/// The job's state column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Claimed.
    Processing,
    /// Requeued by the resetter.
    Queued,
    /// Marked by attempt 1.
    Done,
}

/// The job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// `state`.
    pub state: JobState,
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// `progress`: the last value written.
    pub progress: u8,
    /// `progress_seq`: the writes counted so far.
    pub seq: u8,
}

impl Row {
    /// Whether `owned(id, token)` matches the row now.
    fn owned_by(&self, token: u8) -> bool {
        self.state == JobState::Processing && self.token == token
    }
}

/// Attempt 1's entry in the worker's `Pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pending {
    /// Reported, not taken by a beat.
    pub value: Option<u8>,
    /// Taken by the beat, not returned.
    pub in_flight: Option<u8>,
    /// `counted_by_beats`.
    pub counted: u8,
    /// An own write is on its way.
    pub writing: bool,
}

/// Attempt 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct First {
    /// Its next step in [`PROGRAM`].
    pub pc: u8,
    /// `progress_seq` as it last read it (at its start: 0).
    pub seq: u8,
    /// The count its write on its way names.
    pub writing: Option<u8>,
    /// Its mark ran, or a write was refused (the handler stops): no more
    /// steps, and its lease leaves the heartbeat's list.
    pub ended: bool,
}

/// The heartbeat loop's current beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Beat {
    /// None running.
    Idle,
    /// Its statement runs: it carries `value`, and its snapshot found the
    /// row owned by attempt 1 (`owned`).
    Sent {
        /// The report it took.
        value: u8,
        /// `dbworker_owned` holds the row.
        owned: bool,
    },
    /// Its statement ended, with the row written or not; not returned yet.
    Ended {
        /// The row was written.
        touched: bool,
    },
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The row.
    pub row: Row,
    /// Attempt 1's `Pending` entry.
    pub pending: Pending,
    /// Attempt 1.
    pub first: First,
    /// Attempt 2, once claimed: the count it read, and whether it wrote.
    pub second: Option<(u8, bool)>,
    /// The beat.
    pub beat: Beat,
    /// An abandoned beat's statement, still running: `(value, owned)`.
    pub orphan: Option<(u8, bool)>,
    /// Beats abandoned so far.
    pub abandons: u8,
    /// The resetter ran.
    pub reset: bool,
    /// Ghost: a beat wrote the row while its attempt did not own it.
    pub late: bool,
    /// Ghost: an attempt's write was refused while it owned the row.
    pub owner_refused: bool,
    /// Ghost: a write lowered the row's progress.
    pub regressed: bool,
    /// Ghost: attempt 1's mark was accepted.
    pub marked: bool,
    /// Ghosts for the examples: a beat wrote; a beat's lock re-check refused
    /// the row its snapshot owned; a report went back; an own write counted
    /// a beat's write; the mark wrote the last report; attempt 2 wrote.
    pub seen: [bool; 6],
}

/// Indexes into [`State::seen`].
const BEAT_WROTE: usize = 0;
const BEAT_SKIPPED: usize = 1;
const GAVE_BACK: usize = 2;
const COUNTED: usize = 3;
const LAST_WRITTEN: usize = 4;
const SECOND_WROTE: usize = 5;

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Attempt 1's next report, or the start of its next write
    /// (`start_write`), or its final mark.
    Step,
    /// Attempt 1's write lands and returns.
    Land,
    /// A beat takes the report and reads its snapshot.
    BeatSend,
    /// The beat's lock step: it writes the row if it still matches.
    BeatLock,
    /// The beat writes nothing: it failed, or skipped the row locked by the
    /// handler's transaction.
    BeatMiss,
    /// The beat returns (`returned`).
    BeatReturn,
    /// The loop gives the beat up (`returned` as failed); its statement runs on.
    Abandon,
    /// The abandoned statement's lock step.
    OrphanLock,
    /// The abandoned statement fails after all.
    OrphanMiss,
    /// The resetter requeues the job.
    Reset,
    /// The next claim: token 2; attempt 2 reads the count.
    Claim,
    /// Attempt 2's fenced write.
    SecondWrite,
}

/// The model: which guards are in place.
#[derive(Debug, Clone)]
pub struct BeatsModel {
    /// The beat's lock step re-checks state and token on the newest row.
    pub recheck_lock: bool,
    /// An own write adds the beats' writes to the count it names.
    pub count_beats: bool,
    /// Own writes and the final mark wait until no beat carries the report.
    pub wait_for_beats: bool,
    /// Beats take no report while an own write is on its way.
    pub hold_while_writing: bool,
    /// A report a beat did not write goes back (unless a newer one came).
    pub give_back: bool,
    /// The heartbeat loop may give one beat up while its statement runs on.
    pub abandon: bool,
}

impl BeatsModel {
    /// The real code: every guard, no abandoned beat.
    pub fn new() -> Self {
        BeatsModel {
            recheck_lock: true,
            count_beats: true,
            wait_for_beats: true,
            hold_while_writing: true,
            give_back: true,
            abandon: false,
        }
    }

    /// The beat's (or the orphan's) lock step for `value`, its snapshot
    /// having found the row owned (`owned`): whether it wrote.
    fn beat_lock(&self, n: &mut State, value: u8, owned: bool) -> bool {
        let matches = owned && (!self.recheck_lock || n.row.owned_by(1));
        n.seen[BEAT_SKIPPED] |= owned && !matches;
        if matches {
            n.late |= !n.row.owned_by(1);
            n.regressed |= value < n.row.progress;
            n.row.progress = value;
            n.row.seq += 1;
            n.seen[BEAT_WROTE] = true;
        }
        matches
    }
}

impl Default for BeatsModel {
    fn default() -> Self {
        Self::new()
    }
}

/// `returned` for a beat that took attempt 1's report.
fn returned(model: &BeatsModel, n: &mut State, touched: bool) {
    if let Some(value) = n.pending.in_flight.take() {
        if touched {
            n.pending.counted += 1;
        } else if model.give_back && n.pending.value.is_none() {
            n.pending.value = Some(value);
            n.seen[GAVE_BACK] = true;
        }
    }
}

/// A fenced write of `token` naming `seq` (`None`: any), of `value` if
/// any: whether it matched.
fn write(n: &mut State, token: u8, seq: Option<u8>, value: Option<u8>) -> bool {
    let owned = n.row.owned_by(token);
    if !owned || seq.is_some_and(|s| s != n.row.seq) {
        n.owner_refused |= owned;
        return false;
    }
    if let Some(v) = value {
        n.regressed |= v < n.row.progress;
        n.row.progress = v;
    }
    n.row.seq += 1;
    true
}

impl Model for BeatsModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            row: Row {
                state: JobState::Processing,
                token: 1,
                progress: 0,
                seq: 0,
            },
            pending: Pending::default(),
            first: First {
                pc: 0,
                seq: 0,
                writing: None,
                ended: false,
            },
            second: None,
            beat: Beat::Idle,
            orphan: None,
            abandons: 0,
            reset: false,
            late: false,
            owner_refused: false,
            regressed: false,
            marked: false,
            seen: [false; 6],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let settled = !self.wait_for_beats || s.pending.in_flight.is_none();
        if !s.first.ended {
            match (s.first.writing, PROGRAM[usize::from(s.first.pc)]) {
                (Some(_), _) => actions.push(Action::Land),
                (None, Op::Report(_)) => actions.push(Action::Step),
                (None, _) if settled => actions.push(Action::Step),
                (None, _) => {} // waits for the beat to return
            }
        }
        match s.beat {
            Beat::Idle => {
                let free = !self.hold_while_writing || !s.pending.writing;
                if !s.first.ended
                    && s.pending.in_flight.is_none()
                    && s.pending.value.is_some()
                    && free
                {
                    actions.push(Action::BeatSend);
                }
            }
            Beat::Sent { .. } => {
                actions.extend([Action::BeatLock, Action::BeatMiss]);
                if self.abandon && s.abandons == 0 {
                    actions.push(Action::Abandon);
                }
            }
            Beat::Ended { .. } => actions.push(Action::BeatReturn),
        }
        if s.orphan.is_some() {
            actions.extend([Action::OrphanLock, Action::OrphanMiss]);
        }
        if !s.reset && s.row.state == JobState::Processing {
            actions.push(Action::Reset);
        }
        if s.row.state == JobState::Queued {
            actions.push(Action::Claim);
        }
        if s.second.is_some_and(|(_, wrote)| !wrote) {
            actions.push(Action::SecondWrite);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Step => match PROGRAM[usize::from(s.first.pc)] {
                Op::Report(v) => {
                    n.pending.value = Some(v);
                    n.first.pc += 1;
                }
                op @ (Op::SetProgress(_) | Op::Checkpoint) => {
                    // `start_write`.
                    let counted = std::mem::take(&mut n.pending.counted);
                    let counted = if self.count_beats { counted } else { 0 };
                    n.seen[COUNTED] |= counted > 0;
                    if matches!(op, Op::SetProgress(_)) {
                        n.pending.value = None;
                    }
                    n.pending.writing = self.hold_while_writing;
                    n.first.writing = Some(s.first.seq + counted);
                }
                Op::Finish => {
                    // `last` forgets the entry, then the write and the mark
                    // commit together.
                    let last = s.pending.value;
                    n.pending = Pending::default();
                    n.first.ended = true;
                    if n.row.owned_by(1) {
                        if let Some(v) = last {
                            write(&mut n, 1, None, Some(v));
                            n.seen[LAST_WRITTEN] = true;
                        }
                        n.row.state = JobState::Done;
                        n.marked = true;
                    }
                }
            },
            Action::Land => {
                let value = match PROGRAM[usize::from(s.first.pc)] {
                    Op::SetProgress(v) => Some(v),
                    _ => None,
                };
                n.pending.writing = false;
                n.first.writing = None;
                if write(&mut n, 1, s.first.writing, value) {
                    n.first.seq = n.row.seq; // `RETURNING progress_seq`
                    n.first.pc += 1;
                } else {
                    n.first.ended = true; // `ProgressRefused`: the handler stops
                }
            }
            Action::BeatSend => {
                n.pending.in_flight = n.pending.value.take();
                let value = n.pending.in_flight?;
                n.beat = Beat::Sent {
                    value,
                    owned: s.row.owned_by(1),
                };
            }
            Action::BeatLock | Action::BeatMiss | Action::Abandon => {
                let Beat::Sent { value, owned } = s.beat else {
                    return None;
                };
                match action {
                    Action::BeatLock => {
                        let touched = self.beat_lock(&mut n, value, owned);
                        n.beat = Beat::Ended { touched };
                    }
                    Action::BeatMiss => n.beat = Beat::Ended { touched: false },
                    _ => {
                        returned(self, &mut n, false);
                        n.orphan = Some((value, owned));
                        n.abandons += 1;
                        n.beat = Beat::Idle;
                    }
                }
            }
            Action::BeatReturn => {
                let Beat::Ended { touched } = s.beat else {
                    return None;
                };
                returned(self, &mut n, touched);
                n.beat = Beat::Idle;
            }
            Action::OrphanLock => {
                let (value, owned) = s.orphan?;
                self.beat_lock(&mut n, value, owned);
                n.orphan = None;
            }
            Action::OrphanMiss => n.orphan = None,
            Action::Reset => {
                n.row.state = JobState::Queued;
                n.reset = true;
            }
            Action::Claim => {
                n.row.state = JobState::Processing;
                n.row.token = 2;
                n.second = Some((s.row.seq, false));
            }
            Action::SecondWrite => {
                let (seq, _) = s.second?;
                n.seen[SECOND_WROTE] |= write(&mut n, 2, Some(seq), Some(SECOND_VALUE));
                n.second = Some((seq, true));
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no beat writes for an attempt that lost its claim",
                |_, s: &State| !s.late,
            ),
            Property::always(
                "no write of the owner is refused as stale",
                |_, s: &State| !s.owner_refused,
            ),
            Property::always(
                "no older report lands over a newer value",
                |_, s: &State| !s.regressed,
            ),
            Property::at_end("the last report reaches the row", |_, s: &State| {
                !s.marked || s.row.progress == LAST
            }),
            Property::sometimes("a beat writes a report", |_, s: &State| s.seen[BEAT_WROTE]),
            Property::sometimes(
                "a beat finds the claim gone under its lock",
                |_, s: &State| s.seen[BEAT_SKIPPED],
            ),
            Property::sometimes("a report a beat missed goes back", |_, s: &State| {
                s.seen[GAVE_BACK]
            }),
            Property::sometimes("an own write counts a beat's write", |_, s: &State| {
                s.seen[COUNTED]
            }),
            Property::sometimes("the final mark writes the last report", |_, s: &State| {
                s.seen[LAST_WRITTEN]
            }),
            Property::sometimes("the new attempt writes", |_, s: &State| {
                s.seen[SECOND_WROTE]
            }),
        ]
    }
}
