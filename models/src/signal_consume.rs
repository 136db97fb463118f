//! A resumed attempt consumes its signal only while its claim owns the job.
//!
//! **The real code.** `sql/signals.rs` (`consume_signal`, run by
//! `DbJob::signal` in `store/signals.rs`): one statement, `UPDATE <mailbox>
//! SET consumed_at = now(), consumed_token = $t WHERE id IN (the oldest
//! unconsumed signal, FOR UPDATE) AND EXISTS (SELECT 1 FROM <table> WHERE
//! owned(id, $t) FOR SHARE)`. Its snapshot is taken when it starts; it may
//! run a while, or wait for the mailbox row (another consumer's lock). A
//! locking read evaluates its `WHERE` on the row's newest version, so the
//! claim is checked as it is when the signal is taken, and the job row
//! stays `FOR SHARE` until the consumption commits: the resetter's `FOR
//! UPDATE SKIP LOCKED` passes it over meanwhile. In heartbeat handling the
//! statement commits on its own (modelled here); in transactional handling
//! it runs in the job's transaction, whose `FOR KEY SHARE` on the job row
//! (`lock_claimed`) keeps the resetter off it already.
//!
//! - [`ConsumeModel::lock_job`] `false`: the old `EXISTS` without `FOR
//!   SHARE`, read in the statement's snapshot: a reset and a new claim that
//!   commit while the statement runs leave it true, and the attempt whose
//!   claim was lost takes the signal from the new one.
//!
//! **The model.** One job, claimed (token 1), one committed signal in its
//! mailbox. Each attempt consumes once: its statement starts (the snapshot:
//! whether the claim owned the job then), then takes the signal and commits
//! (one step: under the two row locks nothing else touches either row, and
//! the resetter skips the job row while they are held). The resetter may
//! requeue the processing job `max_resets` times; each claim starts the next
//! attempt.
//!
//! **Invariants.** `nothing consumed by a stale token` (the job's claim, when
//! the consumption commits, is the consumer's); `each signal consumed at
//! most once`. Sometimes: `a stale consumption is refused`, `a later attempt
//! consumes the signal`.

use crate::{Model, Property};

/// Where an attempt's consumption is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Not started.
    Running,
    /// Its statement runs; its snapshot found the job owned (or not).
    Started {
        /// `EXISTS (owned)` in the snapshot.
        owned: bool,
    },
    /// It took the signal, or found none for it.
    Done,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `state = 'processing'`.
    pub processing: bool,
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// Each claim's attempt (token = index + 1).
    pub attempts: Vec<Step>,
    /// Resets so far.
    pub resets: u8,
    /// The tokens that consumed the signal (one, or none, is right).
    pub consumed_by: Vec<u8>,
    /// Ghost: a consumption committed while its token did not own the job.
    pub stale: bool,
    /// Ghost: a consumption found the claim gone under its lock.
    pub refused: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The attempt's statement starts: its snapshot.
    Start(u8),
    /// It locks the signal and the job row, checks, consumes, commits.
    Consume(u8),
    /// The resetter requeues the job.
    Reset,
    /// The next claim.
    Claim,
}

/// The model: its bound and the guard.
#[derive(Debug, Clone)]
pub struct ConsumeModel {
    /// Whether the `EXISTS` locks the job row (`FOR SHARE`).
    pub lock_job: bool,
    /// Resets in all.
    pub max_resets: u8,
}

impl State {
    fn owned_by(&self, token: u8) -> bool {
        self.processing && self.token == token
    }
}

impl Model for ConsumeModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            processing: true,
            token: 1,
            attempts: vec![Step::Running],
            resets: 0,
            consumed_by: Vec::new(),
            stale: false,
            refused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (a, step) in (0u8..).zip(&s.attempts) {
            match step {
                Step::Running => actions.push(Action::Start(a)),
                Step::Started { .. } => actions.push(Action::Consume(a)),
                Step::Done => {}
            }
        }
        if s.processing && s.resets < self.max_resets {
            actions.push(Action::Reset);
        }
        if !s.processing {
            actions.push(Action::Claim);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Start(a) => {
                let owned = s.owned_by(a + 1);
                n.attempts[usize::from(a)] = Step::Started { owned };
            }
            Action::Consume(a) => {
                let Step::Started { owned } = s.attempts[usize::from(a)] else {
                    return None;
                };
                let token = a + 1;
                // `FOR SHARE`: the newest row; without it, the snapshot's.
                let ours = if self.lock_job {
                    s.owned_by(token)
                } else {
                    owned
                };
                n.refused |= owned && !ours;
                // The mailbox row's lock re-checks `consumed_at IS NULL` on
                // its newest version.
                if ours && s.consumed_by.is_empty() {
                    n.stale |= !s.owned_by(token);
                    n.consumed_by.push(token);
                }
                n.attempts[usize::from(a)] = Step::Done;
            }
            Action::Reset => {
                n.processing = false;
                n.resets += 1;
            }
            Action::Claim => {
                n.processing = true;
                n.token += 1;
                n.attempts.push(Step::Running);
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("nothing consumed by a stale token", |_, s: &State| !s.stale),
            Property::always("each signal consumed at most once", |_, s: &State| {
                s.consumed_by.len() <= 1
            }),
            Property::sometimes("a stale consumption is refused", |_, s: &State| s.refused),
            Property::sometimes("a later attempt consumes the signal", |_, s: &State| {
                s.consumed_by.first().is_some_and(|&t| t > 1)
            }),
        ]
    }
}
