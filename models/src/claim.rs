//! The life of a claimed job: claim, heartbeat, open, mark, stall, reset.
//!
//! **The real code.** `sql::claim_limited` (`dbworker/src/sql/claim.rs`) sets a
//! queued or errored row `processing` with a fresh fencing token, its
//! `started_at`: `GREATEST(now(), started_at + 1µs)`, larger than every earlier
//! token of the row (`sql/mod.rs` explains it). Every later write is fenced by
//! `owned()` (`sql/mod.rs`: `id = $id AND state = 'processing' AND token =
//! $token`): `sql::mark_complete`, `mark_errored`, `mark_failed`,
//! `requeue_lost` (`sql/marks.rs`), the grouped marks of `store/completer.rs`,
//! `sql::heartbeat` (`sql/heartbeat.rs`) and, in transactional handling,
//! `sql::lock_claimed` (`sql/claim.rs`, `FOR KEY SHARE`, run by
//! `store/worker_api.rs`'s `open`). `sql::reset_stalled` (`sql/reset.rs`, run by
//! `store/reset.rs`'s `reset_pass` for `maintenance/resetter.rs`) requeues
//! processing rows whose heartbeat is too old, skipping rows a live
//! transaction locks, or fails them once reset `stall.max_num_resets` times
//! (`reset_or_fail` in `sql/mod.rs`).
//!
//! **The model.** Each statement is one atomic step (each is one statement in
//! autocommit, or runs under the job's own row lock). Workers may pause
//! between any two steps: the environment may let any processing row's
//! heartbeat grow old (`Stall`) at any time, so every pause, GC stop or
//! network cut is covered. A worker may crash at any step (its connection,
//! and so its transaction and lock, go). A transactional worker's connection
//! may die under a live transaction: it rolls back, then the worker runs
//! `requeue_lost`. Bounds: [`ClaimModel::new`] takes the counts; the tests use
//! 3 workers, 2 jobs, `max_num_resets` 1 and `max_num_retries` 1 (tokens and
//! counters are then bounded, so the state space is finite); the runs
//! without the guard use 2 workers, enough for their counterexamples.
//!
//! **Invariants.**
//! - `no stale mark accepted`: a mark (or `requeue_lost`) changes the row only
//!   for the row's latest claim (a ghost counter numbers the claims).
//! - `at most one live claimant`: for each job, at most one worker holds a
//!   claim whose mark the row would accept now.
//! - `no job lost`: in a state where no step is possible, every job is
//!   completed or failed (never stuck `processing`, `queued` or `errored`).
//! - `a job completes after a reset` (sometimes): a job is reset and then
//!   completed by a later claim, so the model is not vacuous.
//!
//! **Guard removed.** [`Guard::StateOnly`] fences marks by `id` and `state`
//! but not the token; [`Guard::ClockToken`] takes the token from the clock
//! alone (`now()`, which may repeat: two claims in one microsecond, or a clock
//! stepped back), without `started_at + 1µs`.

use crate::{Model, Property};

/// How marks are fenced, and how a claim makes its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guard {
    /// The real code: a strictly larger token per claim, every write fenced by it.
    Fenced,
    /// Marks match `id` and `state = 'processing'` only.
    StateOnly,
    /// Fenced, but a claim's token may equal the row's previous one.
    ClockToken,
}

/// How the worker runs a job (`StoreOptions::handling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handling {
    /// Marks on the pool; only the heartbeat shows the job is alive.
    Heartbeat,
    /// The job's transaction holds `FOR KEY SHARE` from open to mark.
    Transactional,
}

/// A job's state column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting to be claimed.
    Queued,
    /// Claimed.
    Processing,
    /// Failed with retries left; claimable again.
    Errored,
    /// Final.
    Completed,
    /// Final.
    Failed,
}

/// One job row, with a ghost column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// `state`.
    pub state: JobState,
    /// The fencing token (`started_at`), abstracted to a counter.
    pub token: u8,
    /// `num_resets`.
    pub num_resets: u8,
    /// `num_failures`.
    pub num_failures: u8,
    /// The heartbeat is older than the stalled max age.
    pub stale: bool,
    /// Workers whose transaction holds `FOR KEY SHARE` (a bit each).
    pub key_share: u8,
    /// Ghost: how many claims the row has had (the latest claim's number).
    pub claims: u8,
}

/// What a worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Nothing: ready to claim.
    Idle,
    /// A claimed job, its token, and (ghost) the claim's number.
    Claimed {
        /// The job.
        job: u8,
        /// The token the claim returned.
        token: u8,
        /// Ghost: which claim of the row this is.
        claim: u8,
        /// Transactional handling: `lock_claimed` found the row and holds it.
        open: bool,
    },
}

impl Worker {
    /// The job, token and claim number it holds.
    fn held(self) -> Option<(u8, u8, u8)> {
        match self {
            Worker::Claimed {
                job, token, claim, ..
            } => Some((job, token, claim)),
            Worker::Idle => None,
        }
    }
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The job rows.
    pub rows: Vec<Row>,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Ghost: a mark was accepted from a claim that is not the row's latest.
    pub stale_mark_accepted: bool,
    /// Ghost: a job completed after it had been reset.
    pub completed_after_reset: bool,
}

/// A mark a worker writes when its handler ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkKind {
    /// `mark_complete`.
    Complete,
    /// `mark_errored`: errored with retries left, else failed.
    Errored,
    /// `mark_failed`.
    Failed,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Worker claims job (`sql::claim`); with [`Guard::ClockToken`], `true`
    /// when the clock did not move and the token stays the same.
    Claim(u8, u8, bool),
    /// Transactional open: `sql::lock_claimed`; no row means the job is lost.
    Open(u8),
    /// `sql::heartbeat` for the worker's job.
    Heartbeat(u8),
    /// The worker's mark.
    Mark(u8, MarkKind),
    /// The transactional connection died: rollback, then `sql::requeue_lost`.
    ConnectionLost(u8),
    /// The worker's process dies (its connections close).
    Crash(u8),
    /// Time passes without a heartbeat: the job's heartbeat is now too old.
    Stall(u8),
    /// The resetter's pass resets this stalled, unlocked row.
    Reset(u8),
}

/// The model: its bounds and flags.
#[derive(Debug, Clone)]
pub struct ClaimModel {
    /// Workers.
    pub workers: u8,
    /// Jobs, all queued at the start.
    pub jobs: u8,
    /// `StallOptions::max_num_resets` (a store's and its resetter's `stall`).
    pub max_num_resets: u8,
    /// `max_num_retries`.
    pub max_num_retries: u8,
    /// The handling mode.
    pub handling: Handling,
    /// The guard under test.
    pub guard: Guard,
}

impl ClaimModel {
    /// A model of `workers` workers and `jobs` jobs, `max_num_resets` and
    /// `max_num_retries` 1.
    pub fn new(workers: u8, jobs: u8, handling: Handling, guard: Guard) -> Self {
        ClaimModel {
            workers,
            jobs,
            max_num_resets: 1,
            max_num_retries: 1,
            handling,
            guard,
        }
    }

    /// Whether the row accepts a write fenced by `token` (`owned()`).
    fn owns(&self, row: &Row, token: u8) -> bool {
        row.state == JobState::Processing && (self.guard == Guard::StateOnly || row.token == token)
    }

    /// `reset_or_fail`: back to the queue with one more reset, or failed.
    fn reset_or_fail(&self, row: &mut Row) {
        if row.num_resets < self.max_num_resets {
            row.state = JobState::Queued;
            row.num_resets += 1;
        } else {
            row.state = JobState::Failed;
        }
    }
}

impl Model for ClaimModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let row = Row {
            state: JobState::Queued,
            token: 0,
            num_resets: 0,
            num_failures: 0,
            stale: false,
            key_share: 0,
            claims: 0,
        };
        vec![State {
            rows: vec![row; usize::from(self.jobs)],
            workers: vec![Worker::Idle; usize::from(self.workers)],
            stale_mark_accepted: false,
            completed_after_reset: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (w, worker) in (0u8..).zip(&s.workers) {
            match *worker {
                Worker::Idle => {
                    for (job, row) in (0u8..).zip(&s.rows) {
                        if matches!(row.state, JobState::Queued | JobState::Errored) {
                            actions.push(Action::Claim(w, job, false));
                            if self.guard == Guard::ClockToken {
                                actions.push(Action::Claim(w, job, true));
                            }
                        }
                    }
                }
                Worker::Claimed { open, .. } => {
                    actions.push(Action::Heartbeat(w));
                    actions.push(Action::Crash(w));
                    if self.handling == Handling::Transactional && !open {
                        actions.push(Action::Open(w));
                    } else {
                        for kind in [MarkKind::Complete, MarkKind::Errored, MarkKind::Failed] {
                            actions.push(Action::Mark(w, kind));
                        }
                    }
                    if open {
                        actions.push(Action::ConnectionLost(w));
                    }
                }
            }
        }
        for (job, row) in (0u8..).zip(&s.rows) {
            if row.state == JobState::Processing {
                if !row.stale {
                    actions.push(Action::Stall(job));
                } else if row.key_share == 0 {
                    actions.push(Action::Reset(job));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Claim(worker, job, same_token) => {
                let row = &mut n.rows[usize::from(job)];
                row.state = JobState::Processing;
                row.token += u8::from(!same_token);
                row.stale = false;
                row.claims += 1;
                n.workers[usize::from(worker)] = Worker::Claimed {
                    job,
                    token: row.token,
                    claim: row.claims,
                    open: false,
                };
            }
            Action::Open(w) => {
                let (job, token, _) = s.workers[usize::from(w)].held()?;
                let row = &mut n.rows[usize::from(job)];
                if self.owns(row, token) {
                    row.key_share |= 1 << w;
                    if let Worker::Claimed { open, .. } = &mut n.workers[usize::from(w)] {
                        *open = true;
                    }
                } else {
                    n.workers[usize::from(w)] = Worker::Idle; // Outcome::Lost
                }
            }
            Action::Heartbeat(w) => {
                let (job, token, _) = s.workers[usize::from(w)].held()?;
                let row = &mut n.rows[usize::from(job)];
                if self.owns(row, token) {
                    row.stale = false;
                }
            }
            Action::Mark(w, kind) => {
                let (job, token, claim) = s.workers[usize::from(w)].held()?;
                n.workers[usize::from(w)] = Worker::Idle;
                let (max_retries, owns) = (
                    self.max_num_retries,
                    self.owns(&s.rows[usize::from(job)], token),
                );
                let row = &mut n.rows[usize::from(job)];
                row.key_share &= !(1 << w); // the commit (or rollback) ends the lock
                if owns {
                    n.stale_mark_accepted |= claim != row.claims;
                    row.state = match kind {
                        MarkKind::Complete => JobState::Completed,
                        MarkKind::Failed => JobState::Failed,
                        MarkKind::Errored if row.num_failures + 1 > max_retries => JobState::Failed,
                        MarkKind::Errored => JobState::Errored,
                    };
                    if kind != MarkKind::Complete {
                        row.num_failures += 1;
                    }
                    n.completed_after_reset |= kind == MarkKind::Complete && row.num_resets > 0;
                }
            }
            Action::ConnectionLost(w) => {
                let (job, token, claim) = s.workers[usize::from(w)].held()?;
                n.workers[usize::from(w)] = Worker::Idle;
                let row = &mut n.rows[usize::from(job)];
                row.key_share &= !(1 << w);
                if self.owns(row, token) {
                    n.stale_mark_accepted |= claim != row.claims;
                    self.reset_or_fail(row);
                }
            }
            Action::Crash(w) => {
                if let Worker::Claimed { job, .. } = s.workers[usize::from(w)] {
                    n.rows[usize::from(job)].key_share &= !(1 << w);
                }
                n.workers[usize::from(w)] = Worker::Idle;
            }
            Action::Stall(job) => n.rows[usize::from(job)].stale = true,
            Action::Reset(job) => self.reset_or_fail(&mut n.rows[usize::from(job)]),
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no stale mark accepted", |_, s: &State| {
                !s.stale_mark_accepted
            }),
            Property::always("at most one live claimant", |m: &ClaimModel, s: &State| {
                (0u8..).zip(&s.rows).all(|(job, row)| {
                    let live = s.workers.iter().filter(|w| {
                        matches!(w, Worker::Claimed { job: j, token, .. } if *j == job && m.owns(row, *token))
                    });
                    live.count() <= 1
                })
            }),
            Property::at_end("no job lost", |_, s: &State| {
                s.rows
                    .iter()
                    .all(|r| matches!(r.state, JobState::Completed | JobState::Failed))
            }),
            Property::sometimes("a job completes after a reset", |_, s: &State| {
                s.completed_after_reset
            }),
        ]
    }
}
