//! Executable models of dbworker's concurrency protocols, each checked
//! exhaustively (every interleaving of its actors, for small bounds) by
//! `cargo test -p dbworker-models`.
//!
//! | model | the real code | what it shows |
//! |---|---|---|
//! | [`claim`] | `sql/claim.rs`, `sql/marks.rs`, `sql/reset.rs`, `sql/heartbeat.rs`, `store/reset.rs` | the fencing token keeps every mark to the latest claim; no job is lost |
//! | [`workflow`] | `ddl/workflows.rs` and `ddl/release_set.rs` (the release triggers), `sql/workflow.rs` (`lock_upstreams`) | a dependent is released exactly once, only after all its upstream jobs completed |
//! | [`leader`] | `sql/cluster.rs` (`leader_acquire`, `leader_renew`, `leader_fence`), `cluster/leader.rs`, `cluster/leadership.rs` | with a term and a `FOR SHARE` check, writes of two terms never interleave |
//! | [`checkpoint`] | `consumers/store.rs` (`open_slice`), `sql/consumers.rs` (`log_slice`, `log_advance`) | the old position checkpoint lost events; the `(xid, position)` rule under the snapshot's xmin does not |
//! | [`signal`] | `ddl/signals.rs` (`<table>_signal`: the row locked first; a duplicate wakes nothing), `store/signals.rs` (`wait_job`: the row locked, the mailbox read in a statement of its own, the mark) | a sender and a wait mark that both lock the job row first lose no wake-up; a conditional wake alone does |
//! | [`signal_key`] | `ddl/signals.rs` (`<table>_signal_key`: the holder locked with the key checked again, looping) | a signal by key reaches the job holding the key, never one that let it go |
//! | [`signal_consume`] | `sql/signals.rs` (`consume_signal`: the job row `FOR SHARE`, the claim checked on its newest version), `store/signals.rs` (`DbJob::signal`) | only the attempt owning the job consumes its signal |
//! | [`progress`] | `sql/progress.rs` (`write_progress`: owned, by token, and `progress_seq < $n`, set to `$n`), `sql/progress_table.rs` (`write_progress_side`) | a write fenced by token and number never moves progress back nor lands after the next claim, even out of order |
//! | [`progress_beats`] | `store/progress.rs` (`Pending`: `value`, `in_flight` with its number, `numbered`, `superseded`, `writing`), `store/heartbeat.rs`, `sql/heartbeat.rs` (the lock step re-checks state and token; a report lands above the row's number), `sql/progress_table.rs` (`heartbeat_side`) | reports carried by heartbeats, each numbered when sent, never land for a lost claim nor over a newer value (a beat given up that commits late included), never get the owner's write refused, and the last one reaches the row |
//!
//! Each model has a flag that removes its guard (or selects the old rule),
//! and its tests assert that the checker then finds a counterexample.
//!
//! The checker is [`check`], a breadth-first explorer written here rather
//! than stateright's, which was tried first: it builds fine, but its
//! breadth-first checker overwrites a property's discovery with every later
//! state that violates it, so the counterexample it hands back is the last
//! one found, usually far longer than the shortest, and it pulls in a web
//! server for its explorer UI. This one is a hundred lines: it visits each state once (by a
//! 64-bit fingerprint), keeps the first (so shortest) path to each
//! discovery, and checks "at end" invariants in states where no step is
//! possible.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};

pub mod checkpoint;
pub mod claim;
pub mod leader;
pub mod progress;
pub mod progress_beats;
pub mod signal;
pub mod signal_consume;
pub mod signal_key;
pub mod workflow;

/// A system to explore: its initial states, and the atomic steps enabled in
/// each state.
pub trait Model: Sized {
    /// Everything the system holds, ghost variables included.
    type State: Clone + Eq + Hash + Debug;
    /// One atomic step.
    type Action: Clone + Debug;

    /// The states the system may start in.
    fn init_states(&self) -> Vec<Self::State>;
    /// Pushes every step enabled in `state` onto `actions`.
    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>);
    /// The state after `action`; `None` when the step is not possible after all.
    fn next_state(&self, state: &Self::State, action: Self::Action) -> Option<Self::State>;
    /// What must (or may) hold.
    fn properties(&self) -> Vec<Property<Self>>;
}

/// When a property's condition must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// In every reachable state; a state where it fails is a counterexample.
    Always,
    /// In every reachable state where no step is possible (the end of a run).
    AtEnd,
    /// In at least one reachable state (an example): the model is not vacuous.
    Sometimes,
}

/// A named condition on states.
pub struct Property<M: Model> {
    /// Its name, for reports.
    pub name: &'static str,
    /// When it must hold.
    pub expectation: Expectation,
    /// The condition.
    pub condition: fn(&M, &M::State) -> bool,
}

impl<M: Model> Property<M> {
    /// Must hold in every state.
    pub fn always(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Property {
            name,
            expectation: Expectation::Always,
            condition,
        }
    }

    /// Must hold in every state where no step is possible.
    pub fn at_end(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Property {
            name,
            expectation: Expectation::AtEnd,
            condition,
        }
    }

    /// Must hold in some state.
    pub fn sometimes(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Property {
            name,
            expectation: Expectation::Sometimes,
            condition,
        }
    }
}

impl<M: Model> Debug for Property<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}({})", self.expectation, self.name)
    }
}

/// Whether transaction `t` waits, through others, for itself: a cycle in the
/// wait-for graph of `count` transactions, where `waits_for(x)` has a bit set
/// for each transaction `x` waits for. Postgres's deadlock detector aborts one
/// transaction of such a cycle; models use this to let it.
pub fn in_wait_cycle(count: u8, t: u8, waits_for: impl Fn(u8) -> u8) -> bool {
    let (mut seen, mut frontier) = (0u8, waits_for(t));
    while frontier & !seen != 0 {
        seen |= frontier;
        frontier = (0..count)
            .filter(|&x| seen & (1 << x) != 0)
            .fold(0, |f, x| f | waits_for(x));
    }
    seen & (1 << t) != 0
}

/// What one exhaustive run of a model found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Distinct states visited.
    pub unique_states: usize,
    /// States where no step is possible.
    pub end_states: usize,
    /// The length of the longest shortest path to a state.
    pub max_depth: usize,
    /// Each property with a discovery (a counterexample of an `Always` or
    /// `AtEnd` property, an example of a `Sometimes` one), with its shortest
    /// path printed: one step a line, then the state it ends in.
    pub discoveries: BTreeMap<&'static str, String>,
    /// Whether every reachable state was visited (false when the run stopped
    /// because every property had a discovery).
    pub complete: bool,
}

impl Report {
    /// Whether `property` has a discovery.
    pub fn found(&self, property: &str) -> bool {
        self.discoveries.contains_key(property)
    }

    /// The printed path of `property`'s discovery, or a note that it has none.
    pub fn path(&self, property: &str) -> &str {
        self.discoveries
            .get(property)
            .map_or("(no discovery)", String::as_str)
    }
}

struct Node<M: Model> {
    state: M::State,
    parent: usize,
    action: Option<M::Action>,
    depth: usize,
}

fn fingerprint<S: Hash>(state: &S) -> u64 {
    let mut h = DefaultHasher::new();
    state.hash(&mut h);
    h.finish()
}

fn print_path<M: Model>(nodes: &[Node<M>], mut at: usize) -> String {
    let mut steps = Vec::new();
    let last = format!("  => {:?}\n", nodes[at].state);
    while let Some(action) = &nodes[at].action {
        steps.push(format!("  {action:?}\n"));
        at = nodes[at].parent;
    }
    steps.reverse();
    steps.push(last);
    steps.concat()
}

/// Explores every reachable state of `model` breadth first, until all were
/// visited or every property has a discovery. The visited set holds 64-bit
/// fingerprints (SipHash with fixed keys, so runs are repeatable): with a
/// million states the chance that two collide is below one in ten million.
pub fn check<M: Model>(model: &M) -> Report {
    let properties = model.properties();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut nodes: Vec<Node<M>> = Vec::new();
    for state in model.init_states() {
        if seen.insert(fingerprint(&state)) {
            nodes.push(Node {
                state,
                parent: 0,
                action: None,
                depth: 0,
            });
        }
    }
    let mut discoveries = BTreeMap::new();
    let (mut end_states, mut max_depth, mut actions) = (0, 0, Vec::new());
    let mut at = 0;
    while at < nodes.len() && discoveries.len() < properties.len() {
        actions.clear();
        model.actions(&nodes[at].state, &mut actions);
        let mut next = Vec::new();
        for action in actions.drain(..) {
            if let Some(s) = model.next_state(&nodes[at].state, action.clone()) {
                next.push((s, action));
            }
        }
        let is_end = next.is_empty();
        end_states += usize::from(is_end);
        max_depth = max_depth.max(nodes[at].depth);
        for p in &properties {
            let holds = (p.condition)(model, &nodes[at].state);
            let discovered = match p.expectation {
                Expectation::Always => !holds,
                Expectation::AtEnd => is_end && !holds,
                Expectation::Sometimes => holds,
            };
            if discovered && !discoveries.contains_key(p.name) {
                discoveries.insert(p.name, print_path(&nodes, at));
            }
        }
        let depth = nodes[at].depth + 1;
        for (state, action) in next {
            if seen.insert(fingerprint(&state)) {
                nodes.push(Node {
                    state,
                    parent: at,
                    action: Some(action),
                    depth,
                });
            }
        }
        at += 1;
    }
    Report {
        unique_states: nodes.len(),
        end_states,
        max_depth,
        discoveries,
        complete: at == nodes.len(),
    }
}
