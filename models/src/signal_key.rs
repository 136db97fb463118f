//! Signals sent to a job by its key: delivered to the job holding the key.
//!
//! **The real code.** `ddl/signals.rs`, `<table>_signal_key(key, name, …)`:
//! it reads which live job (`queued`, `errored` or `processing`; a unique
//! index keeps one) holds the key, in a plain `SELECT` (its statement's
//! snapshot, no lock), then locks that row `FOR NO KEY UPDATE` with the key
//! and the live states in the `WHERE`. The lock waits for the row's holder,
//! then evaluates that `WHERE` on the row's newest version: a job that let
//! the key go meanwhile (it completed, failed, was removed, or `remove_job`
//! released its key, and a new job took the key, in a transaction that
//! committed while the sender read or waited) is passed over, and the
//! function looks again (at most 10 times). A job still holding the key
//! gets the signal from `<table>_signal(id, …)`: inserted in the mailbox,
//! and the job woken if it waits for it.
//!
//! - [`SignalKeyModel::recheck`] `false`: the old function, which handed the
//!   id it read to `<table>_signal`, whose lock names the id alone: the job
//!   that let the key go gets the signal, and the one holding it waits on.
//!
//! **The model.** Jobs `0..=moves`, each waiting for the signal while it
//! holds the key; job 0 holds it first. A mover lets the holder go and
//! enqueues the next job with the key, in one transaction: it locks the
//! holder's row (an `UPDATE`, which waits while a sender holds it), then
//! commits. Each sender reads the holder (what was committed), then locks
//! that row and, under the lock, inserts, wakes and commits (one step:
//! nothing else touches the row meanwhile). A retry needs a move, so with
//! `moves` ≤ 2 the real bound of 10 tries is never reached.
//!
//! **Invariants.** `a signal by key goes to the job holding the key` (at its
//! insert). Sometimes: `a sender looks again after the key moved`, `a later
//! holder gets a signal`.

use crate::{Model, Property};

/// Where a sender is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sender {
    /// About to read which job holds the key.
    Read,
    /// Its read found this job.
    Found(u8),
    /// Its signal went to this job.
    Sent(u8),
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The job holding the key, as committed.
    pub holder: u8,
    /// The mover holds the holder's row, its transaction open.
    pub moving: bool,
    /// Moves committed.
    pub moves: u8,
    /// The senders.
    pub senders: Vec<Sender>,
    /// Ghost: a signal went to a job not holding the key.
    pub misdelivered: bool,
    /// Ghost: a sender's lock found the key gone, and it read again.
    pub retried: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The sender reads the holder.
    Read(u8),
    /// The sender locks the job it found; it sends, or reads again.
    Lock(u8),
    /// The mover locks the holder's row and lets the key go (uncommitted).
    MoverLock,
    /// The mover inserts the next job with the key and commits.
    MoverCommit,
}

/// The model: its bounds and the guard.
#[derive(Debug, Clone)]
pub struct SignalKeyModel {
    /// Whether the lock re-checks that the job still holds the key.
    pub recheck: bool,
    /// Senders.
    pub senders: u8,
    /// Times the key moves to a new job.
    pub moves: u8,
}

impl Model for SignalKeyModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            holder: 0,
            moving: false,
            moves: 0,
            senders: vec![Sender::Read; usize::from(self.senders)],
            misdelivered: false,
            retried: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, sender) in (0u8..).zip(&s.senders) {
            match sender {
                Sender::Read => actions.push(Action::Read(i)),
                Sender::Found(_) => actions.push(Action::Lock(i)),
                Sender::Sent(_) => {}
            }
        }
        if s.moving {
            actions.push(Action::MoverCommit);
        } else if s.moves < self.moves {
            actions.push(Action::MoverLock);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Read(i) => n.senders[usize::from(i)] = Sender::Found(s.holder),
            Action::Lock(i) => {
                let Sender::Found(job) = s.senders[usize::from(i)] else {
                    return None;
                };
                if s.moving && job == s.holder {
                    return None; // waits for the mover's transaction
                }
                let holds = job == s.holder;
                n.senders[usize::from(i)] = if holds || !self.recheck {
                    n.misdelivered |= !holds;
                    Sender::Sent(job)
                } else {
                    n.retried = true;
                    Sender::Read
                };
            }
            Action::MoverLock => n.moving = true,
            Action::MoverCommit => {
                n.moving = false;
                n.moves += 1;
                n.holder += 1;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a signal by key goes to the job holding the key",
                |_, s: &State| !s.misdelivered,
            ),
            Property::sometimes(
                "a sender looks again after the key moved",
                |_, s: &State| s.retried,
            ),
            Property::sometimes("a later holder gets a signal", |_, s: &State| {
                s.senders
                    .iter()
                    .any(|x| matches!(x, Sender::Sent(j) if *j > 0))
            }),
        ]
    }
}
