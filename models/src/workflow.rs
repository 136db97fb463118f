//! The release of workflow dependents when their upstream jobs complete.
//!
//! **The real code.** The release trigger (`dbworker/src/ddl/workflows.rs`)
//! runs in the transaction that completes an upstream job: it deletes the
//! job's edges, then for each dependent probes its other edges (`FOR KEY
//! SHARE SKIP LOCKED`, highest first); an edge found is locked, and its
//! deleter releases the dependent later. None found, it first tries the
//! release with a fresh snapshot and no lock (`UPDATE … pending AND NOT
//! EXISTS (edges)`: seeing no edge, every other deleter has committed, and
//! each saw this one's edge); if that updates nothing, it locks the
//! dependent `FOR UPDATE` and, with a snapshot taken after that lock, sets
//! it `queued` if it is `pending` with no edge left. A dependent enqueued
//! later (`enqueue/after.rs`, `sql::lock_upstreams` in `sql/workflow.rs`,
//! the SQL `wait_for`) locks its upstream rows `FOR SHARE` and waits only
//! for those not completed.
//!
//! **The model.** Completions interleave statement by statement (READ
//! COMMITTED: a statement sees what was committed when it started, and its
//! own writes). Row locks: an edge being deleted is skipped by `SKIP LOCKED`;
//! an edge held `FOR KEY SHARE` blocks its deleter; a dependent held `FOR
//! UPDATE` (or updated) blocks the others; upstream rows held `FOR SHARE`
//! block the completing `UPDATE`. A completion may roll back at any step (the mark's transaction
//! fails), then run again; a wait-for cycle aborts one of its transactions
//! (Postgres's deadlock detector). The trigger handles the deleted edges in
//! dependent-id order (`ORDER BY "job_id"` over the `DELETE … RETURNING`),
//! one order for all upstreams; [`WorkflowModel::any_order`] lets each take
//! them in any order, as the trigger did before, which can deadlock.
//! Only completions are modelled (not failures, cancels or the `on_failure`
//! policy). Bounds: the tests use 2 and 3 upstreams, 2 dependents waiting for
//! all of them, one more enqueued concurrently, as many rollbacks as upstreams.
//!
//! **Invariants.**
//! - `released at most once`: a dependent goes `pending` → `queued` once.
//! - `never released early`: its release commits only once all its upstream
//!   jobs committed `completed`.
//! - `released once all completed`: once no transaction is open and all
//!   upstream jobs completed, every dependent was released.
//! - `completions overlap` (sometimes): two completions are in the trigger at
//!   once; `a deadlock` (sometimes) is reported, and expected only when the
//!   deletes may take their edges in different orders.
//!
//! **The set-wise release.** Completions are released by a statement-level
//! trigger (`completions_sql` in `dbworker/src/ddl/release_set.rs`) in phases over all the
//! statement's dependents in id order: the deletes; the release without a
//! lock where no edge is visible ([`Step::FastUpdate`]); the probe
//! ([`Step::Probe`]) for the others; `FOR UPDATE` on those the probe found
//! nothing for ([`Step::LockDep`]); and one `UPDATE` whose snapshot is taken
//! after those locks ([`Step::Update`], one atomic step over them all).
//! [`Variant::SetWise`] runs it in every completion, [`Variant::Mixed`] in
//! the first upstream's beside the row trigger in the others (failures,
//! cancels and deletes still go through the row trigger, and its rules must
//! hold beside the set-wise ones: the row completions of `Mixed` stand for
//! its releases under `ignore` policies). Not modelled: a statement
//! completing several upstreams of one dependent, a transaction running
//! both protocols (a grouped mark mixing failures and completions, which can
//! deadlock and is written again), the `on_failure` cancel, and isolation
//! other than READ COMMITTED (the triggers refuse it). The release without a
//! lock and the probe look at one dependent per step, each seeing the commits
//! up to it, where the real statement's one snapshot may be older; the last
//! check is one step over all its dependents, as its statement is.
//!
//! **Guard removed.** [`Variant::SnapshotOnly`] releases when its own snapshot
//! shows no edge (no probe, no lock): concurrent last completions each see the
//! other's edge and nobody releases. [`Variant::NoRecheck`] trusts a probe that
//! found nothing and releases without the `FOR UPDATE` and the fresh check:
//! it releases while another upstream's completion has not committed.
//! [`Variant::SetWiseNoLock`] leaves out the set-wise `FOR UPDATE`: the last
//! two completions each see the other's edge and nobody releases.
//! [`Variant::SetWiseNoRecheck`] releases the locked dependents without
//! looking at their edges again: early.

use crate::{Model, Property, in_wait_cycle};

/// The release rule under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The trigger as written.
    Real,
    /// `UPDATE … WHERE pending AND NOT EXISTS (edges)` right after the delete.
    SnapshotOnly,
    /// Probe; if nothing is found, release without lock and recheck.
    NoRecheck,
    /// Every completion released set-wise, in phases.
    SetWise,
    /// The first upstream's completion set-wise, the others by the row trigger.
    Mixed,
    /// Set-wise without the `FOR UPDATE` before the last check.
    SetWiseNoLock,
    /// Set-wise, the locked dependents released without a last check.
    SetWiseNoRecheck,
}

/// An edge `(dependent, upstream)` of the edge table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Edge {
    /// No such row (not inserted yet, or its delete committed).
    Absent,
    /// A committed row.
    Present,
    /// Deleted by this upstream's open completion (locked, still visible to others).
    DeletedBy(u8),
}

/// A step of a completion's trigger loop, for one dependent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `PERFORM … FOR KEY SHARE SKIP LOCKED`.
    Probe,
    /// The release without a lock first: `UPDATE … pending AND NOT EXISTS …`
    /// (it waits for the row only if it sees no edge, and so updates it).
    FastUpdate,
    /// `PERFORM 1 FROM table WHERE id = dep FOR UPDATE`.
    LockDep,
    /// `UPDATE table SET state = 'queued' WHERE … pending AND NOT EXISTS …`.
    Update,
}

/// An open completion, inside the trigger.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Trigger {
    /// The dependents whose edge to this job exists, in delete order.
    pub plan: Vec<u8>,
    /// How many of `plan` are deleted.
    pub deleted: usize,
    /// The loop's position in `plan`.
    pub at: usize,
    /// The loop's step (set-wise: the phase).
    pub step: Step,
    /// Set-wise: the dependents done with (a bit each), released or left to
    /// another deleter.
    pub resolved: u8,
}

/// An upstream job's completing transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Not running (the job is still processing).
    Idle,
    /// Open: the job's row is updated (locked), the trigger runs.
    Active(Trigger),
    /// Committed: the job is `completed`.
    Done,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Each upstream's completion.
    pub ups: Vec<Completion>,
    /// Rollbacks the completions may still do, besides deadlock victims.
    pub aborts_left: u8,
    /// The open completion that set each dependent `queued`, uncommitted.
    pub queued_by: Vec<Option<u8>>,
    /// The transaction holding each dependent's row lock.
    pub dep_lock: Vec<Option<u8>>,
    /// Edge `(d, u)` at `d * ups + u`.
    pub edges: Vec<Edge>,
    /// Transactions holding each edge `FOR KEY SHARE` (a bit each).
    pub key_share: Vec<u8>,
    /// The late enqueue: upstream rows it holds `FOR SHARE`; `None` once done.
    pub enqueue: Option<u8>,
    /// Releases committed per dependent: 0 while it is `pending`.
    pub releases: Vec<u8>,
    /// Ghost: a release committed before all its upstream jobs completed.
    pub early: bool,
}

/// One atomic step; transactions are numbered by upstream, the enqueue last.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The completing `UPDATE` (its row lock), and its `DELETE`'s edge order.
    Begin(u8, Vec<u8>),
    /// Deletes the next planned edge.
    Delete(u8),
    /// The loop's next step.
    Loop(u8),
    /// Commits the completion.
    Commit(u8),
    /// Rolls the completion back (deadlock victim, or a failure).
    Abort(u8),
    /// The enqueue locks the next upstream row `FOR SHARE`.
    EnqueueLock,
    /// The enqueue inserts its edges and dependent, and commits.
    EnqueueCommit,
}

/// The model: its bounds and flags.
#[derive(Debug, Clone)]
pub struct WorkflowModel {
    /// Upstream jobs (each dependent waits for all of them).
    pub ups: u8,
    /// Dependents waiting from the start.
    pub deps: u8,
    /// Whether one more dependent is enqueued concurrently.
    pub late: bool,
    /// Whether each `DELETE` may take its edges in any order.
    pub any_order: bool,
    /// Rollbacks per upstream, pooled (`aborts × ups` in all), besides deadlock victims.
    pub aborts: u8,
    /// The release rule.
    pub variant: Variant,
}

impl WorkflowModel {
    /// Whether upstream `u`'s completion releases set-wise.
    fn set_wise(&self, u: u8) -> bool {
        match self.variant {
            Variant::SetWise | Variant::SetWiseNoLock | Variant::SetWiseNoRecheck => true,
            Variant::Mixed => u == 0,
            _ => false,
        }
    }

    fn edge(&self, d: u8, u: u8) -> usize {
        usize::from(d) * usize::from(self.ups) + usize::from(u)
    }

    /// Whether `t`'s statement sees an edge of `d` (deleted only by others).
    fn any_edge_visible(&self, s: &State, t: u8, d: u8) -> bool {
        (0..self.ups).any(|u| match s.edges[self.edge(d, u)] {
            Edge::Present => true,
            Edge::DeletedBy(x) => x != t,
            Edge::Absent => false,
        })
    }

    /// The transactions `t` waits for now (a bit each); 0 if it can go on.
    fn waits_for(&self, s: &State, t: u8) -> u8 {
        if t == self.ups {
            let next = usize::from(s.enqueue.unwrap_or(self.ups));
            return u8::from(matches!(s.ups.get(next), Some(Completion::Active(_)))) << next;
        }
        let Completion::Active(tr) = &s.ups[usize::from(t)] else {
            return 0;
        };
        if let Some(&d) = tr.plan.get(tr.deleted) {
            s.key_share[self.edge(d, t)] & !(1 << t)
        } else if self.set_wise(t) {
            self.set_wise_waits_for(s, t, tr)
        } else if tr.step != Step::Probe
            && let Some(&d) = tr.plan.get(tr.at)
            // Seeing an edge, the fast release's one-time filter is false: it
            // touches no row, so it waits for none.
            && !(tr.step == Step::FastUpdate && self.any_edge_visible(s, t, d))
        {
            let holder = s.dep_lock[usize::from(d)].filter(|&h| h != t);
            holder.map_or(0, |h| 1 << h)
        } else {
            0
        }
    }

    /// What a set-wise completion waits for in its phase: a row another
    /// transaction holds, which its statement would update or lock.
    fn set_wise_waits_for(&self, s: &State, t: u8, tr: &Trigger) -> u8 {
        let held = |d: u8| s.dep_lock[usize::from(d)].filter(|&h| h != t);
        let wanted: Vec<u8> = match tr.step {
            // The filter sees no edge: the row is updated, so waited for.
            Step::FastUpdate => sorted(&tr.plan)
                .get(tr.at)
                .filter(|&&d| !self.any_edge_visible(s, t, d))
                .copied()
                .into_iter()
                .collect(),
            Step::Probe => Vec::new(),
            Step::LockDep => sorted(&tr.plan).get(tr.at).copied().into_iter().collect(),
            // Only without the lock can another hold a row it updates.
            Step::Update => sorted(&tr.plan)
                .into_iter()
                .filter(|&d| tr.resolved & (1 << d) == 0 && !self.any_edge_visible(s, t, d))
                .collect(),
        };
        wanted.into_iter().find_map(held).map_or(0, |h| 1 << h)
    }

    /// One step of set-wise completion `u` in its phase: the dependent at
    /// `at`, or (the last phase) all of them at once. Returns the next
    /// `(at, phase)`; `at` past the end once done.
    fn set_wise_step(&self, n: &mut State, u: u8, tr: &Trigger) -> (usize, Step, u8) {
        let order = sorted(&tr.plan);
        let mut resolved = tr.resolved;
        let free = |n: &State, d: u8| {
            n.releases[usize::from(d)] == 0 && n.queued_by[usize::from(d)].is_none()
        };
        match tr.step {
            Step::FastUpdate => {
                let d = order[tr.at];
                if !self.any_edge_visible(n, u, d) && free(n, d) {
                    n.queued_by[usize::from(d)] = Some(u);
                    n.dep_lock[usize::from(d)] = Some(u);
                    resolved |= 1 << d;
                }
            }
            Step::Probe => {
                let d = order[tr.at];
                let unlocked = (0..self.ups)
                    .rev()
                    .find(|&v| n.edges[self.edge(d, v)] == Edge::Present);
                if let Some(v) = unlocked {
                    n.key_share[self.edge(d, v)] |= 1 << u;
                    resolved |= 1 << d;
                }
            }
            Step::LockDep => {
                if self.variant != Variant::SetWiseNoLock {
                    n.dep_lock[usize::from(order[tr.at])] = Some(u);
                }
            }
            Step::Update => {
                for &d in &order {
                    let none_left = self.variant == Variant::SetWiseNoRecheck
                        || !self.any_edge_visible(n, u, d);
                    if resolved & (1 << d) == 0 && none_left && free(n, d) {
                        n.queued_by[usize::from(d)] = Some(u);
                        n.dep_lock[usize::from(d)] = Some(u);
                    }
                }
                return (order.len(), Step::Update, resolved);
            }
        }
        // The next unresolved dependent in this phase, else the next phase.
        let mut step = tr.step;
        let mut from = tr.at + 1;
        loop {
            if let Some(at) = (from..order.len()).find(|&i| resolved & (1 << order[i]) == 0) {
                return (at, step, resolved);
            }
            step = match step {
                Step::FastUpdate => Step::Probe,
                Step::Probe => Step::LockDep,
                Step::LockDep | Step::Update => {
                    let left = order.iter().any(|&d| resolved & (1 << d) == 0);
                    return if left {
                        (0, Step::Update, resolved)
                    } else {
                        (order.len(), Step::Update, resolved)
                    };
                }
            };
            from = 0;
        }
    }

    fn deadlocked(&self, s: &State, t: u8) -> bool {
        in_wait_cycle(self.ups + 1, t, |x| self.waits_for(s, x))
    }

    /// Ends completion `u`'s transaction: committed, or rolled back.
    fn end(&self, n: &mut State, u: u8, commit: bool) {
        for e in &mut n.edges {
            if *e == Edge::DeletedBy(u) {
                *e = if commit { Edge::Absent } else { Edge::Present };
            }
        }
        for k in &mut n.key_share {
            *k &= !(1 << u);
        }
        n.ups[usize::from(u)] = if commit {
            Completion::Done
        } else {
            Completion::Idle
        };
        for d in 0..n.releases.len() {
            if n.dep_lock[d] == Some(u) {
                n.dep_lock[d] = None;
            }
            if n.queued_by[d] == Some(u) {
                n.queued_by[d] = None;
                n.releases[d] += u8::from(commit);
                n.early |= commit && !n.ups.iter().all(|c| *c == Completion::Done);
            }
        }
    }

    /// A step of `u`'s loop over dependent `d`; `None` when done with `d`.
    fn step(&self, n: &mut State, u: u8, d: u8, step: Step) -> Option<Step> {
        let di = usize::from(d);
        match step {
            Step::Probe if self.variant == Variant::SnapshotOnly => {
                self.step(n, u, d, Step::Update)
            }
            Step::Probe => {
                // Highest first; `SKIP LOCKED` passes edges being deleted.
                let unlocked = (0..self.ups)
                    .rev()
                    .find(|&v| n.edges[self.edge(d, v)] == Edge::Present);
                if let Some(v) = unlocked {
                    let e = self.edge(d, v);
                    n.key_share[e] |= 1 << u;
                    return None; // its deleter releases
                }
                Some(match self.variant {
                    Variant::NoRecheck => Step::Update,
                    _ => Step::FastUpdate,
                })
            }
            Step::FastUpdate => {
                // Evaluated once the row is free: edges only go (an aborted
                // delete's edge was visible all along), so a statement that
                // saw none at its start sees none then either.
                if self.any_edge_visible(n, u, d) {
                    return Some(Step::LockDep);
                }
                if n.releases[di] == 0 && n.queued_by[di].is_none() {
                    n.queued_by[di] = Some(u);
                    n.dep_lock[di] = Some(u);
                    return None;
                }
                Some(Step::LockDep) // FOUND false: the locked path, harmless
            }
            Step::LockDep => {
                n.dep_lock[di] = Some(u);
                Some(Step::Update)
            }
            Step::Update => {
                let none_left =
                    self.variant == Variant::NoRecheck || !self.any_edge_visible(n, u, d);
                if n.releases[di] == 0 && n.queued_by[di].is_none() && none_left {
                    n.queued_by[di] = Some(u);
                    n.dep_lock[di] = Some(u);
                }
                None
            }
        }
    }
}

impl Model for WorkflowModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let (u, d) = (usize::from(self.ups), usize::from(self.deps));
        let all = d + usize::from(self.late);
        let mut edges = vec![Edge::Present; u * d];
        edges.resize(u * all, Edge::Absent);
        vec![State {
            ups: vec![Completion::Idle; u],
            aborts_left: self.aborts * self.ups,
            queued_by: vec![None; all],
            dep_lock: vec![None; all],
            key_share: vec![0; u * all],
            edges,
            enqueue: self.late.then_some(0),
            releases: vec![0; all],
            early: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let deps = u8::try_from(s.releases.len()).expect("few dependents");
        for u in 0..self.ups {
            match &s.ups[usize::from(u)] {
                // The completing UPDATE waits while the enqueue holds the row.
                Completion::Idle if s.enqueue.is_none_or(|held| held <= u) => {
                    let plan: Vec<u8> = (0..deps)
                        .filter(|&d| s.edges[self.edge(d, u)] == Edge::Present)
                        .collect();
                    if self.any_order && plan.len() == 2 {
                        actions.push(Action::Begin(u, vec![plan[1], plan[0]]));
                    }
                    actions.push(Action::Begin(u, plan));
                }
                Completion::Active(tr) => {
                    if self.waits_for(s, u) == 0 {
                        actions.push(match (tr.deleted < tr.plan.len(), tr.at < tr.plan.len()) {
                            (true, _) => Action::Delete(u),
                            (false, true) => Action::Loop(u),
                            (false, false) => Action::Commit(u),
                        });
                    }
                    if s.aborts_left > 0 || self.deadlocked(s, u) {
                        actions.push(Action::Abort(u));
                    }
                }
                _ => {}
            }
        }
        if s.enqueue.is_some() && self.waits_for(s, self.ups) == 0 {
            let all_held = s.enqueue == Some(self.ups);
            actions.push(if all_held {
                Action::EnqueueCommit
            } else {
                Action::EnqueueLock
            });
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Begin(u, plan) => {
                let step = if self.set_wise(u) {
                    Step::FastUpdate
                } else {
                    Step::Probe
                };
                n.ups[usize::from(u)] = Completion::Active(Trigger {
                    plan,
                    deleted: 0,
                    at: 0,
                    step,
                    resolved: 0,
                });
            }
            Action::Delete(u) => {
                let Completion::Active(tr) = &mut n.ups[usize::from(u)] else {
                    return None;
                };
                let e = self.edge(tr.plan[tr.deleted], u);
                tr.deleted += 1;
                n.edges[e] = Edge::DeletedBy(u);
            }
            Action::Loop(u) if self.set_wise(u) => {
                let Completion::Active(tr) = &s.ups[usize::from(u)] else {
                    return None;
                };
                let (at, step, resolved) = self.set_wise_step(&mut n, u, tr);
                if let Completion::Active(tr) = &mut n.ups[usize::from(u)] {
                    (tr.at, tr.step, tr.resolved) = (at, step, resolved);
                }
            }
            Action::Loop(u) => {
                let Completion::Active(tr) = &s.ups[usize::from(u)] else {
                    return None;
                };
                let next = self.step(&mut n, u, tr.plan[tr.at], tr.step);
                let (at, step) = next.map_or((tr.at + 1, Step::Probe), |st| (tr.at, st));
                if let Completion::Active(tr) = &mut n.ups[usize::from(u)] {
                    (tr.at, tr.step) = (at, step);
                }
            }
            Action::Commit(u) => self.end(&mut n, u, true),
            Action::Abort(u) => {
                if !self.deadlocked(s, u) {
                    n.aborts_left -= 1;
                }
                self.end(&mut n, u, false);
            }
            Action::EnqueueLock => n.enqueue = n.enqueue.map(|held| held + 1),
            Action::EnqueueCommit => {
                // The late dependent waits for the upstream jobs not completed.
                let d = self.deps;
                let open: Vec<u8> = (0..self.ups)
                    .filter(|&u| s.ups[usize::from(u)] != Completion::Done)
                    .collect();
                for &u in &open {
                    n.edges[self.edge(d, u)] = Edge::Present;
                }
                n.releases[usize::from(d)] += u8::from(open.is_empty());
                n.enqueue = None;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("released at most once", |_, s: &State| {
                s.releases.iter().all(|&r| r <= 1)
            }),
            Property::always("never released early", |_, s: &State| !s.early),
            Property::always("released once all completed", |_, s: &State| {
                let quiet = s.enqueue.is_none() && s.ups.iter().all(|c| *c == Completion::Done);
                !quiet || s.releases.iter().all(|&r| r == 1)
            }),
            Property::sometimes("completions overlap", |_, s: &State| {
                let active = s.ups.iter().filter(|c| matches!(c, Completion::Active(_)));
                active.count() >= 2
            }),
            Property::sometimes("a deadlock", |m: &Self, s: &State| {
                (0..m.ups).any(|u| m.deadlocked(s, u))
            }),
        ]
    }
}

/// The dependents of a plan in id order (the order of the set-wise statements).
fn sorted(plan: &[u8]) -> Vec<u8> {
    let mut order = plan.to_vec();
    order.sort_unstable();
    order
}
