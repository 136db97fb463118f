//! Progress reported through heartbeats beside the attempt's own fenced
//! writes: no beat writes for a lost claim, no owner's write is refused as
//! stale, no older report lands over a newer value, no last report is lost.
//!
//! **The real code.** `store/progress.rs`: `report_progress` puts the value
//! in the store's `Pending`, per job: `value` (the latest report no beat
//! took), `in_flight` (the one a beat carries), `counted_by_beats` (beats'
//! writes the attempt has not counted yet), `maybe_landed` (beats returned
//! as failed, which may have written all the same) and `writing` (an own
//! write is on its way). A heartbeat (`store/heartbeat.rs`) takes `value`
//! unless a beat carries one or the attempt is writing; its statement
//! (`sql/heartbeat.rs`; `heartbeat_side` in `sql/progress_table.rs`) writes
//! it, counted in `progress_seq`. `returned` counts a written value and gives
//! back one not written (the beat failed, or skipped the row, locked by its
//! handler's transaction) unless a newer one was reported. Own writes
//! (`set_progress`, which drops the unsent report it supersedes;
//! `save_checkpoint`, which keeps it) run `start_write`: they wait until no
//! beat carries the report, add the beats' count to the count they name
//! (`progress_seq = $s`, see [`progress`](crate::progress)), and hold beats
//! off until they return. Refused, `write` reads the count under its token
//! (`read_checkpoint`) and, if it grew by no more than `maybe_landed`, adopts
//! it (`recounted`) and tries again. The final mark writes the report no beat
//! wrote (`last`, after the same wait), fenced by the token, any count. The
//! beat's statement reads the rows it owns in its snapshot (`dbworker_owned`:
//! `processing`, `(id, token)` among the leases), then locks them (`FOR NO
//! KEY UPDATE SKIP LOCKED`), which re-checks state and token on the newest row.
//!
//! **The model.** One job. Attempt 1 (token 1, on the worker whose beats are
//! modelled) runs [`PROGRAM`]; a report and each `Pending` step are atomic
//! (its mutex); an own write is two steps (`start_write`, then the statement
//! lands and returns), a refused one a third (the count read); the final
//! mark is one (`last`, then the last report written with the mark; a mark
//! other than a completion or a wait writes it just before, on its own, but
//! then nothing but a reset comes between, the same as a reset before). One
//! beat at a time (the heartbeat loop): it takes the report and reads its
//! snapshot, its lock step writes or skips the row, it returns. The resetter
//! may requeue the job once; the next claim (token 2) starts attempt 2, on
//! another worker, which reads the count and writes once. Values grow in
//! program order (attempt 2's is the largest): one landing below the row's
//! is an older one.
//!
//! **Invariants.** `no beat writes for an attempt that lost its claim`, `no
//! write of the owner is refused as stale`, `no older report lands over a
//! newer value`, `no own write lands over a foreign write it did not see`;
//! at the end, `the last report reaches the row` when attempt 1's mark was
//! accepted. Sometimes (the model is not vacuous): see the properties.
//!
//! **Guards removed**, one flag each (all `true` is the real code):
//! [`BeatsModel::recheck_lock`] `false` locks by `id IN (owned)` only (the
//! old statement): a reset (and a new claim) between the snapshot and the
//! lock let the beat write the old attempt's report, and the count it adds
//! refuses the new owner's write. [`BeatsModel::count_beats`]: the next own
//! write names a count the beats moved on, and is refused.
//! [`BeatsModel::wait_for_beats`]: the beat lands after the own write, an
//! older report over it (or first, and the own write is refused).
//! [`BeatsModel::hold_while_writing`]: a beat takes the report a checkpoint
//! write kept and lands first; the checkpoint is refused.
//! [`BeatsModel::give_back`]: a report a beat missed is dropped, and the last
//! report never reaches the row. [`BeatsModel::recount`]: with beats
//! abandoned, one that lands after all gets the owner's next write refused.
//!
//! **Not guards.** [`BeatsModel::abandon`]: the heartbeat loop gives a beat
//! up at its timeout (`workerutil/src/heartbeat.rs`), or its statement
//! fails, and `returned` counts it failed though it may commit: its older
//! report can land over a newer value, and stay after the mark if beats wrote
//! the last report (the mark writes only one no beat wrote). Only the attempt
//! and its beats write under its token; [`BeatsModel::foreign_writer`] adds
//! another (a bug, an operator's `UPDATE`): beyond the allowance its write
//! keeps the owner's refused; within it, the count passes for a late beat's.

use crate::{Model, Property};

/// One step of attempt 1's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `report_progress(v)`.
    Report(u8),
    /// `set_progress(v)`: a fenced write of a newer value.
    SetProgress(u8),
    /// `save_checkpoint`: a fenced write keeping progress and the unsent report.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum JobState {
    /// Claimed.
    #[default]
    Processing,
    /// Requeued by the resetter.
    Queued,
    /// Marked by attempt 1.
    Done,
}

/// The job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
    /// `maybe_landed`: beats returned as failed, which may still write.
    pub maybe_landed: u8,
    /// An own write is on its way.
    pub writing: bool,
}

/// Attempt 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct First {
    /// Its next step in [`PROGRAM`].
    pub pc: u8,
    /// `progress_seq` as it last read it (at its start: 0).
    pub seq: u8,
    /// The count its write on its way names.
    pub writing: Option<u8>,
    /// Beats its write may count unbeknown to it (`maybe_landed`, less recounts).
    pub allowance: u8,
    /// Its write was refused: it reads the count (`read_checkpoint`) next.
    pub recounting: bool,
    /// Its mark ran, or a write was refused (the handler stops): no more
    /// steps, and its lease leaves the heartbeat's list.
    pub ended: bool,
}

/// The heartbeat loop's current beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Beat {
    /// None running.
    #[default]
    Idle,
    /// Its statement runs, with the report it took and `dbworker_owned`'s row.
    Sent(u8, bool),
    /// Its statement ended, the row written (`true`) or not; not returned yet.
    Ended(bool),
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
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
    /// A foreign write landed under attempt 1's token.
    pub foreign: bool,
    /// The resetter ran.
    pub reset: bool,
    /// Ghost: a beat wrote the row while its attempt did not own it.
    pub late: bool,
    /// Ghost: an owner's write was refused, no foreign write having landed.
    pub owner_refused: bool,
    /// Ghost: attempt 1's own write landed after a foreign write.
    pub adopted_foreign: bool,
    /// Ghost: a write lowered the row's progress.
    pub regressed: bool,
    /// Ghost: attempt 1's mark was accepted.
    pub marked: bool,
    /// Ghosts for the "sometimes" properties, by the indexes below.
    pub seen: [bool; 8],
}

/// Indexes into [`State::seen`], one per "sometimes" property.
const BEAT_WROTE: usize = 0;
const BEAT_SKIPPED: usize = 1;
const GAVE_BACK: usize = 2;
const COUNTED: usize = 3;
const LAST_WRITTEN: usize = 4;
const SECOND_WROTE: usize = 5;
const RECOUNTED: usize = 6;
const FOREIGN_REFUSED: usize = 7;

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Attempt 1's next report, or the start of its next write
    /// (`start_write`), or its final mark.
    Step,
    /// Attempt 1's write lands and returns.
    Land,
    /// Refused, attempt 1 reads the count under its token, to try again.
    Recount,
    /// A beat takes the report and reads its snapshot.
    BeatSend,
    /// The beat's lock step: it writes the row if it still matches.
    BeatLock,
    /// The beat skips the row (locked by the handler's transaction).
    BeatMiss,
    /// The beat returns (`returned`).
    BeatReturn,
    /// The loop gives the beat up, or it fails, its commit unknown: `returned`
    /// as failed; the statement runs on (landing at once: committed, failed).
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
    /// A write under attempt 1's token by someone else, any count.
    Foreign,
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
    /// A refused own write adopts the count read under its token if it
    /// moved by no more than the beats that may have landed, and tries again.
    pub recount: bool,
    /// The heartbeat loop may give one beat up while its statement runs on.
    pub abandon: bool,
    /// Someone else may write once under attempt 1's token.
    pub foreign_writer: bool,
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
            recount: true,
            abandon: false,
            foreign_writer: false,
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

/// `returned` for a beat that took attempt 1's report: `touched` is
/// `Some(wrote)`, or `None` when it failed or was given up.
fn returned(model: &BeatsModel, n: &mut State, touched: Option<bool>) {
    if let Some(value) = n.pending.in_flight.take() {
        if touched == Some(true) {
            n.pending.counted += 1;
        } else {
            n.pending.maybe_landed += u8::from(touched.is_none());
            if model.give_back && n.pending.value.is_none() {
                n.pending.value = Some(value);
                n.seen[GAVE_BACK] = true;
            }
        }
    }
}

/// Attempt `token`'s write is refused for good (`ProgressRefused`, the handler
/// stops): wrong if it owns the row and no foreign write moved the count.
fn refused(n: &mut State, token: u8) {
    let owned = n.row.owned_by(token);
    n.owner_refused |= owned && !n.foreign;
    n.seen[FOREIGN_REFUSED] |= owned && n.foreign;
    if token == 1 {
        n.first.ended = true;
        n.pending.writing = false;
    }
}

/// A fenced write of `token` naming `seq` (`None`: any), of `value` if
/// any: whether it matched.
fn write(n: &mut State, token: u8, seq: Option<u8>, value: Option<u8>) -> bool {
    if !n.row.owned_by(token) || seq.is_some_and(|s| s != n.row.seq) {
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
                token: 1,
                ..Row::default()
            },
            ..State::default()
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let settled = !self.wait_for_beats || s.pending.in_flight.is_none();
        if !s.first.ended {
            match (s.first.writing, PROGRAM[usize::from(s.first.pc)]) {
                (Some(_), _) if s.first.recounting => actions.push(Action::Recount),
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
            Beat::Sent(..) => {
                actions.extend([Action::BeatLock, Action::BeatMiss]);
                if self.abandon && s.abandons == 0 {
                    actions.push(Action::Abandon);
                }
            }
            Beat::Ended(_) => actions.push(Action::BeatReturn),
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
        if self.foreign_writer && !s.foreign && !s.first.ended && s.row.owned_by(1) {
            actions.push(Action::Foreign);
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
                    n.first.allowance = s.pending.maybe_landed;
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
                if write(&mut n, 1, s.first.writing, value) {
                    n.adopted_foreign |= s.foreign;
                    n.first.seq = n.row.seq; // `RETURNING progress_seq`
                    n.first.pc += 1;
                    n.pending.writing = false;
                    n.first.writing = None;
                } else if self.recount {
                    n.first.recounting = true; // still writing: beats stay off
                } else {
                    refused(&mut n, 1);
                }
            }
            Action::Recount => {
                let named = s.first.writing?;
                n.first.recounting = false;
                // `read_checkpoint`: no row once the claim moved on. The one
                // allowance bounds the tries (the real code's four).
                match s.row.owned_by(1).then_some(s.row.seq) {
                    Some(now) if now > named && now - named <= s.first.allowance => {
                        n.first.allowance -= now - named;
                        n.pending.maybe_landed -= now - named; // `recounted`
                        n.first.writing = Some(now);
                        n.seen[RECOUNTED] = true;
                    }
                    _ => refused(&mut n, 1),
                }
            }
            Action::BeatSend => {
                n.pending.in_flight = n.pending.value.take();
                let value = n.pending.in_flight?;
                n.beat = Beat::Sent(value, s.row.owned_by(1));
            }
            Action::BeatLock | Action::BeatMiss | Action::Abandon => {
                let Beat::Sent(value, owned) = s.beat else {
                    return None;
                };
                match action {
                    Action::BeatLock => {
                        let touched = self.beat_lock(&mut n, value, owned);
                        n.beat = Beat::Ended(touched);
                    }
                    Action::BeatMiss => n.beat = Beat::Ended(false),
                    _ => {
                        returned(self, &mut n, None);
                        n.orphan = Some((value, owned));
                        n.abandons += 1;
                        n.beat = Beat::Idle;
                    }
                }
            }
            Action::BeatReturn => {
                let Beat::Ended(touched) = s.beat else {
                    return None;
                };
                returned(self, &mut n, Some(touched));
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
                let wrote = write(&mut n, 2, Some(seq), Some(SECOND_VALUE));
                if !wrote {
                    refused(&mut n, 2);
                }
                n.seen[SECOND_WROTE] |= wrote;
                n.second = Some((seq, true));
            }
            Action::Foreign => {
                n.row.seq += 1;
                n.foreign = true;
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
            Property::always(
                "no own write lands over a foreign write it did not see",
                |_, s: &State| !s.adopted_foreign,
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
            Property::sometimes(
                "an own write recounts a beat given up that landed",
                |_, s: &State| s.seen[RECOUNTED],
            ),
            Property::sometimes(
                "a foreign write gets an own write refused",
                |_, s: &State| s.seen[FOREIGN_REFUSED],
            ),
        ]
    }
}
