//! Many processes: a registry of live [`Node`]s (a dead process's jobs are
//! requeued early) and [`LeaderElection`] by lease for singleton services,
//! whose writes a [`Leadership`] term fences.
//!
#![doc = include_str!("../../docs/modules/cluster.md")]

pub(crate) mod leader;
pub(crate) mod leadership;
pub(crate) mod nodes;

pub use leader::{
    DEFAULT_LEADER_TABLE, LeaderElection, LeaderOptions, Lease, current_leader, leases,
};
pub use leadership::Leadership;
pub use nodes::{DEFAULT_NODE_TABLE, Node, NodeInfo, NodeOptions, live_nodes, registered_nodes};
