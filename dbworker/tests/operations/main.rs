//! What operators use: the admin API, status counts, the error history, the job history,
//! retention, queue gauges, reading from a replica, and least privilege.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "grants.rs"]
    pub(crate) mod grants;
    #[path = "history.rs"]
    pub(crate) mod history;
    #[path = "purge.rs"]
    pub(crate) mod purge;
    #[path = "replica.rs"]
    pub(crate) mod replica;
    #[path = "router.rs"]
    pub(crate) mod router;
}

mod admin_actions;
mod admin_search;
mod error_history;
mod gauges;
mod grants;
mod grants_workflows;
mod history;
mod purge;
mod purge_history;
mod replica;
mod status_counts;
