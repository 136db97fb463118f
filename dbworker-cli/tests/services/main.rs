//! The long-running commands as processes: a worker killed mid-job and `dbworker reset`, log
//! consumers, nodes and retention.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../cli/mod.rs"]
mod cli;
#[path = "../../../dbworker/tests/common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../../../dbworker/tests/common"]
mod fixtures {
    #[path = "consumers.rs"]
    pub(crate) mod consumers;
    #[path = "crash.rs"]
    pub(crate) mod crash;
    #[path = "nodes.rs"]
    pub(crate) mod nodes;
    #[path = "purge.rs"]
    pub(crate) mod purge;
}

mod consumers;
mod crash;
mod nodes;
mod purge;
