//! Progress reported through heartbeats beside the attempt's own writes,
//! every write numbered: no beat writes for a lost claim, no owner's write is
//! refused, no older report lands over a newer value (a beat given up that
//! commits late included), no last report is lost.
//!
//! **The real code.** `store/progress.rs`: `report_progress` puts the value
//! in the store's `Pending`, per job: `value` (the latest report no beat
//! took), `in_flight` (the one a beat carries, with its number), `numbered`
//! (the attempt's last number, shared with its `DbJob`; it starts at the
//! row's `progress_seq` its claim read), `superseded` (the number of its
//! newest own progress write) and `writing` (an own write is on its way).
//! Every write of the attempt takes the next number when it is sent: a
//! heartbeat (`store/heartbeat.rs`) taking `value` unless a beat carries one
//! or the attempt is writing, `set_progress` (which drops the unsent report
//! it supersedes), `save_checkpoint` (which keeps it), the final mark's last
//! report. Each lands only while the claim owns the row (`token`, state
//! `processing`) and the row's number is below its own, which it sets
//! (`sql/progress.rs` `write_progress`; `sql/heartbeat.rs`; `heartbeat_side`
//! in `sql/progress_table.rs`). `returned` gives back a report its beat did
//! not write (skipped, refused, failed or given up at its timeout) unless a
//! newer one was reported or written since; sent again, it takes a new,
//! larger number. Own writes hold beats off until they return; they need not
//! wait for a beat on its way: one landing after them is refused by its
//! number. The final mark writes the report no beat is known to have written
//! (`last`: the unsent one, or the one a beat still carries), numbered,
//! without waiting. The beat's statement reads the rows it owns in its
//! snapshot (`dbworker_owned`: `processing`, `(id, token)` among the leases),
//! then locks them (`FOR NO KEY UPDATE SKIP LOCKED`), which re-checks state
//! and token on the newest row; the number is compared on it too.
//!
//! **The model.** One job. Attempt 1 (token 1, on the worker whose beats are
//! modelled) runs [`PROGRAM`]; a report and each `Pending` step are atomic
//! (its mutex); an own write is two steps (numbered and sent, then it lands
//! or is refused and returns); the final mark is one (`last`, then the last
//! report written with the mark; a mark other than a completion or a wait
//! writes it just before, on its own, but then nothing but a reset comes
//! between, the same as a reset before). One beat at a time (the heartbeat
//! loop): it takes the report and its number and reads its snapshot, its
//! lock step writes, is refused or skips the row, it returns. The loop may
//! give one beat up ([`BeatsModel::abandon`]) while its statement runs on and
//! commits at any later time. The resetter may requeue the job once; the
//! next claim (token 2) starts attempt 2, on another worker, which numbers
//! its write above the row's number its claim read. Values grow in program
//! order (attempt 2's is the largest): one landing below the row's is an
//! older one. Bound: no beat is sent past number 7 (beats that miss the row
//! would number for ever).
//!
//! **Invariants.** `no beat writes for an attempt that lost its claim`, `no
//! write of the owner is refused`, `no older report lands over a newer
//! value` (`no beat given up lands an older report over a newer value`, the
//! late beat's case of it); at the end, `the last report reaches the row` when attempt 1's
//! mark was accepted. Sometimes (the model is not vacuous): see the
//! properties, among them `a beat given up that commits late is refused by
//! its number`.
//!
//! **Guards removed**, one flag each (all `true` is the real code):
//! [`BeatsModel::number_writes`] `false` lands a beat by its token alone (the
//! statement before numbering, which counted writes instead): a beat
//! carrying an older report lands after a newer own write, or, given up,
//! after the write of the report it gave back. [`BeatsModel::recheck_lock`]
//! `false` locks by `id IN (owned)` only: a reset (and a new claim) between
//! the snapshot and the lock let the beat write the old attempt's report,
//! and its number refuses the new owner's write.
//! [`BeatsModel::hold_while_writing`]: a beat numbered after a checkpoint
//! write lands first; the checkpoint is refused.
//! [`BeatsModel::give_back`]: a report a beat missed is dropped, and the last
//! report never reaches the row. [`BeatsModel::drop_superseded`]: a report
//! a newer own write outnumbered goes back, and is sent again over it.
//! [`BeatsModel::mark_in_flight`]: the mark writes only the unsent report,
//! and the last one, on a beat the mark outruns, is lost.
//!
//! **Gone with the numbers.** The count fence (`progress_seq = $s`) made an
//! own write add the beats' writes to the count it named (`count_beats`),
//! wait for a beat on its way (`wait_for_beats`), and read the count again
//! after a beat given up landed (`recount`); a beat given up could still land
//! an older report over a newer one, the limit the numbers remove. A write
//! under the attempt's token by someone else (a bug, an operator's `UPDATE`)
//! is not modelled any more: the count refused the owner's next write after
//! it, the numbers order it below the next one.

mod state;

pub use state::*;

use crate::{Model, Property};

/// The bound on numbers: beats that miss and send their report again would
/// go on numbering for ever; past it no beat is sent, and the mark writes
/// the report.
const MAX_NUMBER: u8 = 7;

/// The model: which guards are in place.
#[derive(Debug, Clone)]
pub struct BeatsModel {
    /// A write lands only above the row's number (beats included).
    pub number_writes: bool,
    /// The beat's lock step re-checks state and token on the newest row.
    pub recheck_lock: bool,
    /// Beats take no report while an own write is on its way.
    pub hold_while_writing: bool,
    /// A report a beat did not write goes back (unless a newer one came).
    pub give_back: bool,
    /// A report numbered below the attempt's newest own progress write does
    /// not go back.
    pub drop_superseded: bool,
    /// The mark writes the report a beat still carries, if no newer one.
    pub mark_in_flight: bool,
    /// The heartbeat loop may give one beat up while its statement runs on.
    pub abandon: bool,
}

impl BeatsModel {
    /// The real code: every guard, no abandoned beat.
    pub fn new() -> Self {
        BeatsModel {
            number_writes: true,
            recheck_lock: true,
            hold_while_writing: true,
            give_back: true,
            drop_superseded: true,
            mark_in_flight: true,
            abandon: false,
        }
    }

    /// The beat's (or the orphan's) lock step for `value` numbered `number`,
    /// its snapshot having found the row owned (`owned`): whether it wrote.
    fn beat_lock(&self, n: &mut State, (value, number, owned): (u8, u8, bool)) -> bool {
        let matches = owned && (!self.recheck_lock || n.row.owned_by(1));
        n.seen[BEAT_SKIPPED] |= owned && !matches;
        let above = !self.number_writes || number > n.row.seq;
        n.seen[OUTNUMBERED] |= matches && !above;
        if matches && above {
            n.late |= !n.row.owned_by(1);
            n.regressed |= value < n.row.progress;
            n.row.progress = value;
            n.row.seq = n.row.seq.max(number);
            n.seen[BEAT_WROTE] = true;
        }
        matches && above
    }

    /// `returned` for a beat that took attempt 1's report: whether it wrote.
    fn returned(&self, n: &mut State, wrote: bool) {
        let Some((value, number)) = n.pending.in_flight.take() else {
            return;
        };
        let older = self.drop_superseded && number < n.pending.superseded;
        if !wrote && self.give_back && n.pending.value.is_none() && !older {
            n.pending.value = Some(value);
            n.seen[GAVE_BACK] = true;
        }
    }
}

impl Default for BeatsModel {
    fn default() -> Self {
        Self::new()
    }
}

/// Attempt `token`'s write is refused (`ProgressRefused`, the handler
/// stops): wrong if it owns the row.
fn refused(n: &mut State, token: u8) {
    n.owner_refused |= n.row.owned_by(token);
    if token == 1 {
        n.first.ended = true;
        n.pending.writing = false;
    }
}

/// A write of `token` numbered `number`, of `value` if any: whether it landed.
fn write(n: &mut State, token: u8, number: u8, value: Option<u8>) -> bool {
    if !n.row.owned_by(token) || number <= n.row.seq {
        return false;
    }
    if let Some(v) = value {
        n.regressed |= v < n.row.progress;
        n.row.progress = v;
    }
    n.row.seq = number;
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
        if !s.first.ended {
            actions.push(match s.first.writing {
                Some(_) => Action::Land,
                None => Action::Step,
            });
        }
        match s.beat {
            Beat::Idle => {
                let free = !self.hold_while_writing || !s.pending.writing;
                if !s.first.ended
                    && s.pending.in_flight.is_none()
                    && s.pending.value.is_some()
                    && free
                    && s.pending.numbered < MAX_NUMBER
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
                    // `start_write`: numbered now, beats held off.
                    n.pending.numbered += 1;
                    if matches!(op, Op::SetProgress(_)) {
                        n.pending.value = None;
                        n.pending.superseded = n.pending.numbered;
                    }
                    n.pending.writing = self.hold_while_writing;
                    n.first.writing = Some(n.pending.numbered);
                }
                Op::Finish => {
                    // `last` forgets the entry, then the numbered write and
                    // the mark commit together.
                    let carried = s
                        .pending
                        .in_flight
                        .filter(|&(_, number)| self.mark_in_flight && number > s.pending.superseded)
                        .map(|(v, _)| v);
                    let last = s.pending.value.or(carried);
                    n.seen[CARRIED_TO_MARK] |= s.pending.value.is_none() && carried.is_some();
                    let number = s.pending.numbered + 1;
                    n.pending = Pending::default();
                    n.first.ended = true;
                    if n.row.owned_by(1) {
                        if let Some(v) = last {
                            if !write(&mut n, 1, number, Some(v)) {
                                n.owner_refused = true;
                            }
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
                if write(&mut n, 1, s.first.writing?, value) {
                    n.first.pc += 1;
                    n.pending.writing = false;
                    n.first.writing = None;
                } else {
                    refused(&mut n, 1);
                }
            }
            Action::BeatSend => {
                let value = n.pending.value.take()?;
                n.pending.numbered += 1;
                let number = n.pending.numbered;
                n.pending.in_flight = Some((value, number));
                n.beat = Beat::Sent(value, number, s.row.owned_by(1));
            }
            Action::BeatLock | Action::BeatMiss | Action::Abandon => {
                let Beat::Sent(value, number, owned) = s.beat else {
                    return None;
                };
                match action {
                    Action::BeatLock => {
                        let wrote = self.beat_lock(&mut n, (value, number, owned));
                        n.beat = Beat::Ended(wrote);
                    }
                    Action::BeatMiss => n.beat = Beat::Ended(false),
                    _ => {
                        self.returned(&mut n, false);
                        n.orphan = Some((value, number, owned));
                        n.abandons += 1;
                        n.beat = Beat::Idle;
                    }
                }
            }
            Action::BeatReturn => {
                let Beat::Ended(wrote) = s.beat else {
                    return None;
                };
                self.returned(&mut n, wrote);
                n.beat = Beat::Idle;
            }
            Action::OrphanLock => {
                let orphan = s.orphan?;
                let owned_now = n.row.owned_by(1) && orphan.2;
                let wrote = self.beat_lock(&mut n, orphan);
                n.seen[LATE_REFUSED] |= owned_now && !wrote;
                n.late_over_newer |= wrote && orphan.0 < s.row.progress;
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
                n.second = Some((s.row.seq + 1, false));
            }
            Action::SecondWrite => {
                let (number, _) = s.second?;
                let wrote = write(&mut n, 2, number, Some(SECOND_VALUE));
                if !wrote {
                    refused(&mut n, 2);
                }
                n.seen[SECOND_WROTE] |= wrote;
                n.second = Some((number, true));
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
            Property::always("no write of the owner is refused", |_, s: &State| {
                !s.owner_refused
            }),
            Property::always(
                "no older report lands over a newer value",
                |_, s: &State| !s.regressed,
            ),
            Property::always(
                "no beat given up lands an older report over a newer value",
                |_, s: &State| !s.late_over_newer,
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
            Property::sometimes(
                "a beat is refused by a newer write's number",
                |_, s: &State| s.seen[OUTNUMBERED],
            ),
            Property::sometimes("the final mark writes the last report", |_, s: &State| {
                s.seen[LAST_WRITTEN]
            }),
            Property::sometimes("the new attempt writes", |_, s: &State| {
                s.seen[SECOND_WROTE]
            }),
            Property::sometimes(
                "a beat given up that commits late is refused by its number",
                |_, s: &State| s.seen[LATE_REFUSED],
            ),
            Property::sometimes(
                "the final mark writes the report a beat still carries",
                |_, s: &State| s.seen[CARRIED_TO_MARK],
            ),
        ]
    }
}
