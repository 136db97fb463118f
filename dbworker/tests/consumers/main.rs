//! Checkpointed log consumers: assignments, dispatch and the log's head, concurrent writers, and
//! the troubleshooting SQL of the operations manual.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "consumers.rs"]
    pub(crate) mod consumers;
    #[path = "grants.rs"]
    pub(crate) mod grants;
}

/// Consumers read an event only once every transaction in the cluster that
/// took an id before it has ended, and the troubleshooting queries name the
/// cluster's oldest such transaction: the tests that measure dispatch or name
/// that transaction run alone (`write`), the others of this binary, which
/// share its cluster, beside each other (`read`).
static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod consumer_dispatch;
mod consumer_members;
mod consumer_troubleshooting;
mod consumers;
mod consumers_concurrent_writers;
