//! Durable waits and signals on a job row: no lost wake-up.
//!
//! **The real code.** `ddl/signals.rs` (`<table>_signal`), `store/signals.rs`
//! (`wait_job`) and `sql/signals.rs` (`lock_owned`, `signal_sent`,
//! `mark_waiting`), where "waiting" is `queued` with the signal's name in
//! `awaiting` and the timeout as the run time. A handler ends its attempt by
//! waiting for a signal name; its wait mark parks the row `waiting` unless
//! the signal is already in the mailbox (a sidecar table, unique per `(job,
//! dedupe key)`, `INSERT … ON CONFLICT DO NOTHING`). A sender, in its own
//! transaction, inserts the signal and, unless it was a duplicate (the
//! function then returns), wakes the job if it waits (`UPDATE … SET
//! process_after = now(), awaiting = NULL WHERE id = $1 AND awaiting = $name
//! AND state IN ('queued', 'errored')`). A mark that finds the signal
//! requeues the job to run at once, and the next attempt consumes it
//! (`consume_signal`, recording `consumed_token`); the model folds both into
//! the mark ("consume and complete"), fenced by the mark's token. The
//! consumption's own fence is checked by [`signal_consume`](crate::signal_consume),
//! sending by key by [`signal_key`](crate::signal_key).
//!
//! - [`Protocol::Locked`]: both serialize on the job row. The sender first
//!   locks it (`SELECT … FOR NO KEY UPDATE`), then inserts, wakes, commits;
//!   the wait mark first locks it, fenced by the token (no row: the attempt
//!   lost its claim and writes nothing), then reads the mailbox in a new
//!   statement (a new snapshot, taken after the lock): a signal is consumed
//!   and the job completes, else the job waits. Whoever locks second sees the
//!   other's commit.
//! - [`Protocol::Naive`]: no lock before the check. The mark reads the
//!   mailbox (one statement, its snapshot), then sets `waiting` (fenced). A
//!   sender whose conditional wake runs while the job is still `processing`
//!   matches no row and takes no lock, and if it commits after the mark's
//!   read, the job parks with its signal unseen. A foreign key from the
//!   mailbox takes `FOR KEY SHARE` on the job row, which conflicts with
//!   neither the mark's `UPDATE` nor `FOR NO KEY UPDATE`: it orders nothing.
//! - [`Protocol::OneStatement`]: the sender locks, but the mark is one
//!   statement (`UPDATE … SET state = CASE WHEN EXISTS (mailbox) …`): it waits
//!   for the sender's lock, then re-checks its `WHERE` on the newest row
//!   version, but the subquery keeps the snapshot the statement began with.
//!
//! **The model.** One job, claimed (token 1) and processing; its attempt runs
//! "receive signal N": consume one if there, else wait. Senders (the tests
//! run 1 to 3) each send N with a dedupe key (a duplicate wakes nothing).
//! Each statement is an atomic step; READ COMMITTED: a statement sees what
//! was committed when it started. Row locks:
//! an `UPDATE` or `FOR NO KEY UPDATE` waits for the job row's holder, then
//! evaluates its `WHERE` on the newest row version; the claim and the
//! resetter skip a locked row (`SKIP LOCKED`). An insert waits for an
//! uncommitted row with its dedupe key, then does nothing if that committed.
//! Steps taken under the job row lock with nothing else to race are merged
//! (the locked mark's read, writes and commit). The resetter may requeue the
//! processing job once (its attempt went stale) and a claim gives a new token
//! and a new attempt; a woken job is claimed again. With
//! [`SignalModel::timeouts`] a waiting job may be claimed at any time (its run
//! time is its deadline); a timed-out attempt that finds no signal completes.
//! With [`SignalModel::aborts`] a sender may roll back (its wake with it).
//! Bounds: 3 claims, 1 reset.
//!
//! **Invariants.**
//! - `never waiting on a committed signal`: the job is never `waiting` while
//!   a committed, unconsumed signal exists (its sender is gone, nobody wakes
//!   it); `no job left waiting on a delivered signal` at the end.
//! - `no timeout with a committed signal unseen`: a timed-out attempt never
//!   completes without a signal that was committed before its mark.
//! - `each signal consumed at most once`; `one signal row per dedupe key`.
//! - `nothing consumed by a stale token`; `no stale attempt changes the job`.
//! - Sometimes: `a signal sent before the wait is seen without parking`, `a
//!   parked job is woken and consumes its signal`, `a stale attempt is
//!   refused`, `a duplicate send is absorbed`, `a wait times out`.
//!
//! **Guard removed.** [`Protocol::Naive`] and [`Protocol::OneStatement`]
//! lose the wake-up; [`SignalModel::fenced`] `false` drops the token from the
//! mark's `WHERE`, and a stale attempt consumes the signal.

use crate::{Model, Property};

/// How the wait mark and the sender order themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Both lock the job row first; the mark reads the mailbox after its lock.
    Locked,
    /// The mark reads, then writes; the sender's wake is conditional only.
    Naive,
    /// The sender locks; the mark's read is the snapshot of its `UPDATE`,
    /// taken before it waits for the lock.
    OneStatement,
}

/// The job's state column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Claimable.
    Queued,
    /// Claimed.
    Processing,
    /// Parked until a signal (or its deadline).
    Waiting,
    /// Final.
    Completed,
}

/// A holder of the job row's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    /// An attempt (by index).
    Attempt(u8),
    /// A sender (by index).
    Sender(u8),
}

/// The job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Job {
    /// `state`.
    pub state: JobState,
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// The transaction holding the row lock, if any.
    pub lock: Option<Who>,
}

/// A mailbox row (inserted by one sender, visible once it commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signal {
    /// The sender whose transaction inserted it.
    pub sender: u8,
    /// Its dedupe key.
    pub key: u8,
    /// Its sender committed.
    pub committed: bool,
    /// Ghost: how many marks consumed it (`consumed_attempt` set).
    pub consumptions: u8,
}

/// Where an attempt's wait mark is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptStep {
    /// The handler runs; the mark has not begun.
    Running,
    /// Locked: holds the job row.
    Locked,
    /// Naive, one statement: its read found this sender's signal (or none).
    Read(Option<u8>),
    /// Its mark ended (written or refused).
    Done,
}

/// One claim's attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// The token its claim returned.
    pub token: u8,
    /// Claimed from `waiting` at its deadline: finding no signal, it completes.
    pub timeout: bool,
    /// Its mark's progress.
    pub step: AttemptStep,
}

/// Where a sender's transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenderStep {
    /// Not begun.
    Start,
    /// Locked: holds the job row.
    Locked,
    /// Inserted.
    Inserted,
    /// Ran its conditional wake (or found its key committed: nothing
    /// inserted, no wake).
    Woken,
    /// Committed.
    Committed,
    /// Rolled back.
    Aborted,
}

/// A sender of signal N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sender {
    /// Its dedupe key.
    pub key: u8,
    /// Its progress.
    pub step: SenderStep,
    /// Its wake matched (so it holds the row lock, and a rollback undoes it).
    pub woke: bool,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The job row.
    pub job: Job,
    /// The mailbox, in insert order.
    pub mailbox: Vec<Signal>,
    /// Every claim's attempt, oldest first.
    pub attempts: Vec<Attempt>,
    /// The senders.
    pub senders: Vec<Sender>,
    /// Resets so far.
    pub resets: u8,
    /// Ghost: a timed-out mark completed while a committed signal was unconsumed.
    pub blind: bool,
    /// Ghost: a signal was consumed by an attempt whose token is not the row's.
    pub stale_consumed: bool,
    /// Ghost: a mark changed the job for a token that is not the row's.
    pub stale_write: bool,
    /// Ghost: the job was parked at some point.
    pub parked: bool,
    /// Ghost: a sender's wake committed.
    pub woken: bool,
    /// Ghost: a signal was consumed before the job ever parked.
    pub early_seen: bool,
    /// Ghost: a stale attempt's mark was refused.
    pub refused: bool,
    /// Ghost: an insert found its key committed and did nothing.
    pub absorbed: bool,
    /// Ghost: a timed-out attempt completed without a signal.
    pub timed_out: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Locked: the attempt's mark locks the job row, fenced by its token.
    AttemptLock(u8),
    /// Naive, one statement: the mark reads the mailbox (its snapshot).
    AttemptRead(u8),
    /// The mark's write and commit: consume and complete, or park.
    AttemptMark(u8),
    /// Locked, one statement: the sender locks the job row.
    SenderLock(u8),
    /// The sender inserts its signal (`ON CONFLICT DO NOTHING`).
    SenderInsert(u8),
    /// The sender's `UPDATE … SET state = 'queued' WHERE state = 'waiting'`.
    SenderWake(u8),
    /// The sender commits.
    SenderCommit(u8),
    /// The sender rolls back.
    SenderAbort(u8),
    /// The resetter requeues the processing job (its attempt is now stale).
    Reset,
    /// A claim: queued (or, with timeouts, waiting) to processing, new token.
    Claim,
}

/// The model: its bounds and flags.
#[derive(Debug, Clone)]
pub struct SignalModel {
    /// The protocol under test.
    pub protocol: Protocol,
    /// Whether the mark's `WHERE` includes the token.
    pub fenced: bool,
    /// Each sender's dedupe key (equal keys: a duplicate send).
    pub keys: Vec<u8>,
    /// Whether a waiting job may be claimed at its deadline.
    pub timeouts: bool,
    /// Whether a sender may roll back.
    pub aborts: bool,
    /// Claims in all (the first is made before the model starts).
    pub max_claims: u8,
    /// Resets in all.
    pub max_resets: u8,
}

impl SignalModel {
    /// `protocol` with senders of `keys`, fenced, no timeouts or rollbacks,
    /// 3 claims and 1 reset.
    pub fn new(protocol: Protocol, keys: &[u8]) -> Self {
        SignalModel {
            protocol,
            fenced: true,
            keys: keys.to_vec(),
            timeouts: false,
            aborts: false,
            max_claims: 3,
            max_resets: 1,
        }
    }

    /// Whether the mark's `WHERE id = $id AND state = 'processing' [AND token
    /// = $t]` matches the row now.
    fn owns(&self, job: &Job, token: u8) -> bool {
        job.state == JobState::Processing && (!self.fenced || job.token == token)
    }
}

/// Whether `who` may take (or already holds) the job row lock.
fn free_for(job: &Job, who: Who) -> bool {
    job.lock.is_none_or(|h| h == who)
}

/// The first committed, unconsumed signal (by sender), as a read sees it now.
fn first_unconsumed(s: &State) -> Option<u8> {
    s.mailbox
        .iter()
        .find(|m| m.committed && m.consumptions == 0)
        .map(|m| m.sender)
}

/// The mark's write and commit, once its `WHERE` matched: consume `found`
/// and complete, else park (or, timed out, complete).
fn mark(n: &mut State, a: u8, found: Option<u8>) {
    let attempt = n.attempts[usize::from(a)];
    n.stale_write |= attempt.token != n.job.token;
    match found {
        Some(sender) => {
            let signal = n.mailbox.iter_mut().find(|m| m.sender == sender);
            if let Some(signal) = signal {
                signal.consumptions += 1;
            }
            n.stale_consumed |= attempt.token != n.job.token;
            n.early_seen |= !n.parked;
            n.job.state = JobState::Completed;
        }
        None => {
            if attempt.timeout {
                n.blind |= first_unconsumed(n).is_some();
                n.timed_out = true;
                n.job.state = JobState::Completed;
            } else {
                n.parked = true;
                n.job.state = JobState::Waiting;
            }
        }
    }
    n.job.lock = None;
    n.attempts[usize::from(a)].step = AttemptStep::Done;
}

impl Model for SignalModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let sender = |&key| Sender {
            key,
            step: SenderStep::Start,
            woke: false,
        };
        vec![State {
            job: Job {
                state: JobState::Processing,
                token: 1,
                lock: None,
            },
            mailbox: Vec::new(),
            attempts: vec![Attempt {
                token: 1,
                timeout: false,
                step: AttemptStep::Running,
            }],
            senders: self.keys.iter().map(sender).collect(),
            resets: 0,
            blind: false,
            stale_consumed: false,
            stale_write: false,
            parked: false,
            woken: false,
            early_seen: false,
            refused: false,
            absorbed: false,
            timed_out: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let locked = self.protocol == Protocol::Locked;
        let sender_locks = self.protocol != Protocol::Naive;
        for (a, attempt) in (0u8..).zip(&s.attempts) {
            match attempt.step {
                AttemptStep::Running if locked => actions.push(Action::AttemptLock(a)),
                AttemptStep::Running => actions.push(Action::AttemptRead(a)),
                AttemptStep::Locked | AttemptStep::Read(_) => actions.push(Action::AttemptMark(a)),
                AttemptStep::Done => {}
            }
        }
        for (i, sender) in (0u8..).zip(&s.senders) {
            match sender.step {
                SenderStep::Start if sender_locks => actions.push(Action::SenderLock(i)),
                SenderStep::Start | SenderStep::Locked => actions.push(Action::SenderInsert(i)),
                SenderStep::Inserted => actions.push(Action::SenderWake(i)),
                SenderStep::Woken => actions.push(Action::SenderCommit(i)),
                SenderStep::Committed | SenderStep::Aborted => {}
            }
            if self.aborts
                && matches!(
                    sender.step,
                    SenderStep::Locked | SenderStep::Inserted | SenderStep::Woken
                )
            {
                actions.push(Action::SenderAbort(i));
            }
        }
        if s.job.lock.is_none() {
            if s.job.state == JobState::Processing && s.resets < self.max_resets {
                actions.push(Action::Reset);
            }
            let claimable = s.job.state == JobState::Queued
                || (self.timeouts && s.job.state == JobState::Waiting);
            if claimable && s.job.token < self.max_claims {
                actions.push(Action::Claim);
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::AttemptLock(a) => {
                let who = Who::Attempt(a);
                if !free_for(&s.job, who) {
                    return None; // waits for the holder
                }
                let attempt = &mut n.attempts[usize::from(a)];
                if self.owns(&s.job, attempt.token) {
                    attempt.step = AttemptStep::Locked;
                    n.job.lock = Some(who);
                } else {
                    attempt.step = AttemptStep::Done; // lost its claim: writes nothing
                    n.refused = true;
                }
            }
            Action::AttemptRead(a) => {
                // A plain read: MVCC, waits for no lock.
                n.attempts[usize::from(a)].step = AttemptStep::Read(first_unconsumed(s));
            }
            Action::AttemptMark(a) => {
                let attempt = s.attempts[usize::from(a)];
                match attempt.step {
                    // Under the lock, a new statement: it sees every commit so far.
                    AttemptStep::Locked => mark(&mut n, a, first_unconsumed(s)),
                    AttemptStep::Read(found) => {
                        if !free_for(&s.job, Who::Attempt(a)) {
                            return None; // the `UPDATE` waits for the holder
                        }
                        if self.owns(&s.job, attempt.token) {
                            mark(&mut n, a, found);
                        } else {
                            n.attempts[usize::from(a)].step = AttemptStep::Done;
                            n.refused = true;
                        }
                    }
                    _ => return None,
                }
            }
            Action::SenderLock(i) => {
                let who = Who::Sender(i);
                if !free_for(&s.job, who) {
                    return None;
                }
                n.job.lock = Some(who);
                n.senders[usize::from(i)].step = SenderStep::Locked;
            }
            Action::SenderInsert(i) => {
                let key = s.senders[usize::from(i)].key;
                let same_key = s.mailbox.iter().find(|m| m.key == key);
                n.senders[usize::from(i)].step = match same_key {
                    Some(m) if !m.committed => return None, // waits for that sender
                    Some(_) => {
                        // DO NOTHING, and the function returns before its wake.
                        n.absorbed = true;
                        SenderStep::Woken
                    }
                    None => {
                        n.mailbox.push(Signal {
                            sender: i,
                            key,
                            committed: false,
                            consumptions: 0,
                        });
                        SenderStep::Inserted
                    }
                };
            }
            Action::SenderWake(i) => {
                let who = Who::Sender(i);
                if !free_for(&s.job, who) {
                    return None; // the `UPDATE` waits, then re-checks the newest row
                }
                let sender = &mut n.senders[usize::from(i)];
                if s.job.state == JobState::Waiting {
                    n.job.state = JobState::Queued;
                    n.job.lock = Some(who);
                    sender.woke = true;
                }
                sender.step = SenderStep::Woken;
            }
            Action::SenderCommit(i) | Action::SenderAbort(i) => {
                let commit = matches!(action, Action::SenderCommit(_));
                let sender = &mut n.senders[usize::from(i)];
                if commit {
                    sender.step = SenderStep::Committed;
                    n.woken |= sender.woke;
                    if let Some(m) = n.mailbox.iter_mut().find(|m| m.sender == i) {
                        m.committed = true;
                    }
                } else {
                    sender.step = SenderStep::Aborted;
                    if sender.woke {
                        n.job.state = JobState::Waiting; // it held the row since its wake
                    }
                    n.mailbox.retain(|m| m.sender != i);
                }
                if n.job.lock == Some(Who::Sender(i)) {
                    n.job.lock = None;
                }
            }
            Action::Reset => {
                n.job.state = JobState::Queued;
                n.resets += 1;
            }
            Action::Claim => {
                n.job.state = JobState::Processing;
                n.job.token += 1;
                n.attempts.push(Attempt {
                    token: n.job.token,
                    timeout: s.job.state == JobState::Waiting,
                    step: AttemptStep::Running,
                });
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never waiting on a committed signal", |_, s: &State| {
                s.job.state != JobState::Waiting || first_unconsumed(s).is_none()
            }),
            Property::always(
                "no timeout with a committed signal unseen",
                |_, s: &State| !s.blind,
            ),
            Property::at_end(
                "no job left waiting on a delivered signal",
                |_, s: &State| s.job.state != JobState::Waiting || first_unconsumed(s).is_none(),
            ),
            Property::always("each signal consumed at most once", |_, s: &State| {
                s.mailbox.iter().all(|m| m.consumptions <= 1)
            }),
            Property::always("one signal row per dedupe key", |_, s: &State| {
                s.mailbox
                    .iter()
                    .enumerate()
                    .all(|(i, m)| s.mailbox[..i].iter().all(|o| o.key != m.key))
            }),
            Property::always("nothing consumed by a stale token", |_, s: &State| {
                !s.stale_consumed
            }),
            Property::always("no stale attempt changes the job", |_, s: &State| {
                !s.stale_write
            }),
            Property::sometimes(
                "a signal sent before the wait is seen without parking",
                |_, s: &State| s.early_seen,
            ),
            Property::sometimes(
                "a parked job is woken and consumes its signal",
                |_, s: &State| s.woken && s.job.state == JobState::Completed && !s.timed_out,
            ),
            Property::sometimes("a stale attempt is refused", |_, s: &State| s.refused),
            Property::sometimes("a duplicate send is absorbed", |_, s: &State| s.absorbed),
            Property::sometimes("a wait times out", |_, s: &State| s.timed_out),
        ]
    }
}
