//! The operators' commands: admin actions, reschedule, their output, the error history,
//! partitions, `top`, workflows, limits and `dbworker ui`.
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
    #[path = "dashboard.rs"]
    pub(crate) mod dashboard;
    #[path = "history.rs"]
    pub(crate) mod history;
}

mod admin;
mod bulk;
mod dashboard;
mod error_history;
mod exit_codes;
mod fair_show;
mod limits;
mod names_escaped;
mod operator_output;
mod partitions;
mod refusals;
mod reschedule;
mod top;
mod workflow;
