//! Fenced progress checkpoints that survive retries: what the fence alone
//! guarantees when writes may land in any order.
//!
//! **The real code.** `sql/progress.rs` (`write_progress`, and
//! `write_progress_side` in `sql/progress_table.rs` for the side table):
//! `UPDATE … SET checkpoint = $v, progress_seq = $n WHERE id = $id AND
//! state = 'processing' AND token = $t AND progress_seq < $n RETURNING
//! progress_seq`: each write of an attempt takes the next number above the
//! row's `progress_seq` its claim read. A retried attempt reads the
//! checkpoint when it starts (`read_checkpoint`) and resumes from it. `store/progress.rs`
//! awaits each write, so one attempt's own writes never overlap; the write
//! that can land late is a heartbeat carrying a report, which
//! [`progress_beats`](crate::progress_beats) models with the store's
//! bookkeeping. This model lets every write land late and in any order, to
//! show what each part of the fence is for.
//!
//! - [`Fence::TokenAndSeq`]: the write above.
//! - [`Fence::TokenOnly`]: without `progress_seq < $n`: a stale attempt is
//!   refused, but one attempt's reordered writes move its progress back.
//! - [`Fence::None`]: `WHERE id = $id` (River's `JobUpdate`): a slow attempt
//!   overwrites the next attempt's progress.
//!
//! **The model.** One job, claimed by attempt 1 (token 1) from checkpoint 0.
//! An attempt that started from checkpoint `c` and number `s` sends its
//! writes in order, write `k` carrying progress `c + k` and numbered `s + k`
//! (a write is "sent"), and each lands later, in any order (one
//! atomic statement, autocommit). The resetter may requeue the job while attempt 1 still runs
//! (it is paused, or its heartbeat is late): the row is `queued`, so attempt
//! 1's writes are refused from then on, though it does not know and keeps
//! sending. The next claim gives token 2 and attempt 2 reads the checkpoint
//! and the count, and writes from there. Bounds: `writes` per attempt (the
//! tests use 2 and 3), one reset.
//!
//! **Invariants.**
//! - `checkpoint never moves backward`: no landing write lowers it.
//! - `no write of an old attempt after a new claim`.
//! - `a new attempt resumes from the latest checkpoint`: what attempt 2 reads
//!   is never older than a checkpoint attempt 1 had landed before the reset.
//! - Sometimes: `a new attempt resumes from progress`, `writes land out of
//!   order`, `a write is refused`.

use crate::{Model, Property};

/// The checkpoint write's `WHERE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fence {
    /// `id = $id AND state = 'processing' AND token = $t AND progress_seq < $n`.
    TokenAndSeq,
    /// `id = $id AND state = 'processing' AND token = $t`.
    TokenOnly,
    /// `id = $id`.
    None,
}

/// The job row's checkpoint columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// `state = 'processing'` (false once the resetter requeued it).
    pub processing: bool,
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// The checkpoint: how far the work got.
    pub checkpoint: u8,
    /// `progress_seq`: the number of the newest write landed.
    pub seq: u8,
}

/// One claim's attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// The checkpoint and number it resumed from.
    pub base: (u8, u8),
    /// Writes sent so far (write `k`, from 1, carries `base.0 + k` and is
    /// numbered `base.1 + k`).
    pub sent: u8,
    /// Sent writes not landed yet: bit `k - 1` for write `k`.
    pub in_flight: u8,
    /// Ghost: the highest write of it that was applied (landed or refused).
    pub applied: u8,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The row.
    pub row: Row,
    /// Attempt 1, then attempt 2 once claimed (token = index + 1).
    pub attempts: Vec<Attempt>,
    /// The resetter requeued the job.
    pub reset: bool,
    /// Ghost: the highest checkpoint attempt 1 landed.
    pub best_first: u8,
    /// Ghost: `best_first` when the reset happened.
    pub best_at_reset: u8,
    /// Ghost: a landing write lowered the checkpoint.
    pub regressed: bool,
    /// Ghost: attempt 1's write landed after attempt 2's claim.
    pub late: bool,
    /// Ghost: attempt 2 read a checkpoint below `best_at_reset`.
    pub stale_read: bool,
    /// Ghost: a write was applied after a later one of its attempt.
    pub reordered: bool,
    /// Ghost: a write's `WHERE` matched nothing.
    pub refused: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The attempt (by index) sends its next write.
    Send(u8),
    /// Write `k` of the attempt lands: the `UPDATE` runs and commits.
    Land(u8, u8),
    /// The resetter requeues the job.
    Reset,
    /// The next claim: token 2, and attempt 2 reads the checkpoint and number.
    Claim,
}

/// The model: its bounds and fence.
#[derive(Debug, Clone)]
pub struct ProgressModel {
    /// Writes each attempt sends.
    pub writes: u8,
    /// The fence under test.
    pub fence: Fence,
}

impl Model for ProgressModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            row: Row {
                processing: true,
                token: 1,
                checkpoint: 0,
                seq: 0,
            },
            attempts: vec![Attempt {
                base: (0, 0),
                sent: 0,
                in_flight: 0,
                applied: 0,
            }],
            reset: false,
            best_first: 0,
            best_at_reset: 0,
            regressed: false,
            late: false,
            stale_read: false,
            reordered: false,
            refused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (a, attempt) in (0u8..).zip(&s.attempts) {
            if attempt.sent < self.writes {
                actions.push(Action::Send(a));
            }
            for k in 1..=attempt.sent {
                if attempt.in_flight & (1 << (k - 1)) != 0 {
                    actions.push(Action::Land(a, k));
                }
            }
        }
        if !s.reset {
            actions.push(Action::Reset);
        } else if s.attempts.len() == 1 {
            actions.push(Action::Claim);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Send(a) => {
                let attempt = &mut n.attempts[usize::from(a)];
                attempt.sent += 1;
                attempt.in_flight |= 1 << (attempt.sent - 1);
            }
            Action::Land(a, k) => {
                let attempt = &mut n.attempts[usize::from(a)];
                attempt.in_flight &= !(1 << (k - 1));
                n.reordered |= k < attempt.applied;
                attempt.applied = attempt.applied.max(k);
                let (value, number, token) = (attempt.base.0 + k, attempt.base.1 + k, a + 1);
                let owned = s.row.processing && s.row.token == token;
                let matches = match self.fence {
                    Fence::TokenAndSeq => owned && s.row.seq < number,
                    Fence::TokenOnly => owned,
                    Fence::None => true,
                };
                if matches {
                    n.regressed |= value < s.row.checkpoint;
                    n.late |= a == 0 && s.attempts.len() > 1;
                    n.row.checkpoint = value;
                    n.row.seq = s.row.seq.max(number);
                    if a == 0 {
                        n.best_first = n.best_first.max(value);
                    }
                } else {
                    n.refused = true;
                }
            }
            Action::Reset => {
                n.reset = true;
                n.row.processing = false;
                n.best_at_reset = s.best_first;
            }
            Action::Claim => {
                n.row.processing = true;
                n.row.token = 2;
                n.stale_read |= s.row.checkpoint < s.best_at_reset;
                n.attempts.push(Attempt {
                    base: (s.row.checkpoint, s.row.seq),
                    sent: 0,
                    in_flight: 0,
                    applied: 0,
                });
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("checkpoint never moves backward", |_, s: &State| {
                !s.regressed
            }),
            Property::always(
                "no write of an old attempt after a new claim",
                |_, s: &State| !s.late,
            ),
            Property::always(
                "a new attempt resumes from the latest checkpoint",
                |_, s: &State| !s.stale_read,
            ),
            Property::sometimes("a new attempt resumes from progress", |_, s: &State| {
                s.attempts.get(1).is_some_and(|a| a.base.0 > 0)
            }),
            Property::sometimes("writes land out of order", |_, s: &State| s.reordered),
            Property::sometimes("a write is refused", |_, s: &State| s.refused),
        ]
    }
}
