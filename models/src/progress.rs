//! Fenced progress checkpoints that survive retries.
//!
//! **The real code.** `store/progress.rs` and `sql/progress.rs`
//! (`write_progress`), which compare the write count for equality and count
//! each write (the same guard: a write that names an old count is refused).
//! An attempt writes its resume state with
//! `UPDATE … SET checkpoint = $v, seq = $s WHERE id = $id AND token = $t AND
//! seq < $s`; a retried attempt reads the checkpoint when it is claimed and
//! resumes from it. Writes may be coalesced
//! (flushed with the heartbeat) or sent on another connection, so one
//! attempt's writes can land late and out of order.
//!
//! - [`Fence::TokenAndSeq`]: the write above.
//! - [`Fence::TokenOnly`]: `WHERE id = $id AND token = $t`: a stale attempt is
//!   refused, but one attempt's reordered writes move its progress back.
//! - [`Fence::None`]: `WHERE id = $id` (River's `JobUpdate`): a slow attempt
//!   overwrites the next attempt's progress.
//!
//! **The model.** One job, claimed by attempt 1 (token 1) from checkpoint 0.
//! An attempt sends its writes in order, each its progress and seq one above
//! the last (a write is "sent"), and each lands later, in any order (one
//! atomic statement, autocommit). The resetter may requeue the job while
//! attempt 1 still runs (it is paused, or its heartbeat is late); the next
//! claim gives token 2 and returns the row (`RETURNING`), so attempt 2
//! reads the checkpoint in the claim's statement and writes from there.
//! Attempt 1 does not know it was reset: it keeps sending. A reset does not
//! change the token, so attempt 1's writes still land until the claim: that
//! is progress it made, and the claim reads it. Bounds: `writes` per attempt
//! (the tests use 2 and 3), one reset.
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
    /// `id = $id AND token = $t AND seq < $s`.
    TokenAndSeq,
    /// `id = $id AND token = $t`.
    TokenOnly,
    /// `id = $id`.
    None,
}

/// The job row's checkpoint columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// The checkpoint: how far the work got.
    pub checkpoint: u8,
    /// `seq` of the write that set it.
    pub seq: u8,
}

/// One claim's attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// The checkpoint and seq it resumed from.
    pub base: (u8, u8),
    /// Writes sent so far (write `k`, from 1, carries `base + k`).
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
    /// The next claim: token 2, and attempt 2 reads the checkpoint.
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
                let (value, seq, token) = (attempt.base.0 + k, attempt.base.1 + k, a + 1);
                let matches = match self.fence {
                    Fence::TokenAndSeq => s.row.token == token && s.row.seq < seq,
                    Fence::TokenOnly => s.row.token == token,
                    Fence::None => true,
                };
                if matches {
                    n.regressed |= value < s.row.checkpoint;
                    n.late |= a == 0 && s.attempts.len() > 1;
                    n.row.checkpoint = value;
                    n.row.seq = seq;
                    if a == 0 {
                        n.best_first = n.best_first.max(value);
                    }
                } else {
                    n.refused = true;
                }
            }
            Action::Reset => {
                n.reset = true;
                n.best_at_reset = s.best_first;
            }
            Action::Claim => {
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
