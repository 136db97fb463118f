//! The leader lease with a term (epoch), and writes only the leader may make.
//!
//! **The real code.** `sql::leader_acquire` (`dbworker/src/sql/cluster.rs`)
//! takes a scope's lease row with `INSERT … ON CONFLICT DO UPDATE … WHERE
//! mine OR expires_at <= now()`, incrementing its `term`; `sql::leader_renew`
//! renews it for the holder's term only; `LeaderElection::run`
//! (`dbworker/src/cluster/leader.rs`) hands each term's services a
//! `Leadership` (`cluster/leadership.rs`) whose `fence` (`sql::leader_fence`)
//! runs first in a leader-only write's transaction: it locks the lease row
//! `FOR SHARE` and checks `holder = me AND term = my term AND expires_at >
//! clock`; a takeover's `UPDATE` then waits for that transaction to end. The
//! row is never deleted (a release expires it), so terms only grow. Before
//! issue 25 the services' writes checked nothing ([`Guard::None`]).
//!
//! **The model.** A node's campaign step is one atomic statement (autocommit);
//! it cannot run while any transaction holds the row `FOR SHARE` (the
//! `ON CONFLICT DO UPDATE` needs a row lock that conflicts with `FOR SHARE`;
//! `FOR KEY SHARE` would not conflict, so the lock must be `FOR SHARE`). A
//! success sets the node's belief (its term); a failure ends it. Time may
//! make the lease expire at any moment; a node may pause between any two
//! steps, and a write transaction's connection may die (rollback). A node's
//! write is two steps: the check (with its lock), then the write and commit.
//! Bounds: 3 nodes, terms up to 3.
//!
//! **Invariants.** Writes are "accepted" when they commit.
//! - `writes in term order`: the terms of accepted writes never decrease.
//! - `no write after a newer grant`: no write of term t is accepted once a term
//!   above t was granted (committed).
//! - `a new term writes while the old leader still believes` (sometimes): the
//!   dangerous situation is reached.
//!
//! **Guard removed.** [`Guard::None`] is the code before terms: whoever believes it
//! leads writes. [`Guard::Unlocked`] checks holder and term with a plain read
//! (or `FOR KEY SHARE`), so a takeover can slip between check and commit.
//! With [`Guard::Locked`] the clock check (`expires_at > clock`) can be
//! dropped ([`LeaderModel::check_expiry`]) and the order still holds: the
//! lock and the term give the order; the clock only bounds how long after
//! expiry an old leader may still write.

use crate::{Model, Property};

/// What a leader-only write checks before it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guard {
    /// Locks the lease row `FOR SHARE`, checks holder, term (and expiry).
    Locked,
    /// Checks holder, term (and expiry) without a lock that blocks a takeover.
    Unlocked,
    /// Checks nothing (the code before terms).
    None,
}

/// The lease row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// `holder`.
    pub holder: u8,
    /// `term`.
    pub term: u8,
    /// `expires_at` is in the past (database clock).
    pub expired: bool,
}

/// A node's leader-only write transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Txn {
    /// None open.
    Idle,
    /// Checked (or, unguarded, decided) as leader of `term`; holds the row
    /// `FOR SHARE` when `locked`.
    Checked {
        /// The term the node believed in.
        term: u8,
        /// Holds `FOR SHARE` on the lease row.
        locked: bool,
    },
}

/// A node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Node {
    /// The term it believes it leads, if any.
    pub belief: Option<u8>,
    /// Its write transaction.
    pub txn: Txn,
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The lease row, once inserted.
    pub lease: Option<Lease>,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Ghost: the term of the last accepted write (0: none yet).
    pub last_write: u8,
    /// Ghost: a write was accepted with a term below the previous write's.
    pub out_of_order: bool,
    /// Ghost: a write was accepted with a term below the highest granted.
    pub after_grant: bool,
}

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `leader_acquire`: insert, renew, or take over an expired lease.
    Campaign(u8),
    /// The lease's time runs out.
    Expire,
    /// The node, believing it leads, opens its write and checks.
    Check(u8),
    /// The write and its commit.
    Commit(u8),
    /// The write transaction's connection dies: rollback.
    Abort(u8),
}

/// The model: its bounds and flags.
#[derive(Debug, Clone)]
pub struct LeaderModel {
    /// Nodes campaigning.
    pub nodes: u8,
    /// The highest term a takeover may grant (the bound).
    pub max_term: u8,
    /// The write's guard.
    pub guard: Guard,
    /// Whether the check includes `expires_at > clock`.
    pub check_expiry: bool,
    /// Whether the holder's own renewal of its expired lease takes a new
    /// term (the design may read "acquiring an expired lease" either way).
    pub new_term_on_late_renewal: bool,
}

impl LeaderModel {
    /// `nodes` nodes, terms up to 3, with the clock check.
    pub fn new(nodes: u8, guard: Guard) -> Self {
        LeaderModel {
            nodes,
            max_term: 3,
            guard,
            check_expiry: true,
            new_term_on_late_renewal: false,
        }
    }

    /// The check's condition for `node` believing `term`.
    fn passes(&self, s: &State, node: u8, term: u8) -> bool {
        s.lease.is_some_and(|l| {
            l.holder == node && l.term == term && !(self.check_expiry && l.expired)
        })
    }
}

impl Model for LeaderModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let node = Node {
            belief: None,
            txn: Txn::Idle,
        };
        vec![State {
            lease: None,
            nodes: vec![node; usize::from(self.nodes)],
            last_write: 0,
            out_of_order: false,
            after_grant: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let share_locked = s
            .nodes
            .iter()
            .any(|n| matches!(n.txn, Txn::Checked { locked: true, .. }));
        for (i, node) in (0u8..).zip(&s.nodes) {
            if !share_locked {
                actions.push(Action::Campaign(i));
            }
            match node.txn {
                Txn::Idle if node.belief.is_some() => actions.push(Action::Check(i)),
                Txn::Idle => {}
                Txn::Checked { .. } => {
                    actions.push(Action::Commit(i));
                    actions.push(Action::Abort(i));
                }
            }
        }
        if s.lease.is_some_and(|l| !l.expired) {
            actions.push(Action::Expire);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Campaign(i) => {
                let node = &mut n.nodes[usize::from(i)];
                n.lease = match s.lease {
                    None => Some(Lease {
                        holder: i,
                        term: 1,
                        expired: false,
                    }),
                    Some(l) if l.holder == i && !(l.expired && self.new_term_on_late_renewal) => {
                        Some(Lease {
                            expired: false,
                            ..l
                        })
                    }
                    Some(l) if l.expired && l.term < self.max_term => Some(Lease {
                        holder: i,
                        term: l.term + 1,
                        expired: false,
                    }),
                    Some(l) if l.expired => return None, // past the bound
                    Some(l) => {
                        node.belief = None; // another holds it: step down
                        Some(l)
                    }
                };
                if let Some(l) = n.lease
                    && l.holder == i
                {
                    node.belief = Some(l.term);
                }
            }
            Action::Expire => {
                if let Some(l) = &mut n.lease {
                    l.expired = true;
                }
            }
            Action::Check(i) => {
                let term = s.nodes[usize::from(i)].belief?;
                let node = &mut n.nodes[usize::from(i)];
                let passes = self.guard == Guard::None || self.passes(s, i, term);
                if passes {
                    node.txn = Txn::Checked {
                        term,
                        locked: self.guard == Guard::Locked,
                    };
                } else {
                    node.belief = None; // the check failed: step down
                }
            }
            Action::Commit(i) => {
                let Txn::Checked { term, .. } = s.nodes[usize::from(i)].txn else {
                    return None;
                };
                let granted = s.lease.map_or(0, |l| l.term);
                n.out_of_order |= term < s.last_write;
                n.after_grant |= term < granted;
                n.last_write = term;
                n.nodes[usize::from(i)].txn = Txn::Idle;
            }
            Action::Abort(i) => n.nodes[usize::from(i)].txn = Txn::Idle,
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("writes in term order", |_, s: &State| !s.out_of_order),
            Property::always("no write after a newer grant", |_, s: &State| {
                !s.after_grant
            }),
            Property::sometimes(
                "a new term writes while the old leader still believes",
                |_, s: &State| {
                    s.lease.is_some_and(|l| {
                        s.last_write == l.term
                            && s.nodes.iter().any(|n| n.belief.is_some_and(|t| t < l.term))
                    })
                },
            ),
        ]
    }
}
