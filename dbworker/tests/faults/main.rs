//! Worker processes killed with SIGKILL (marks in flight, workflows) and issue 37's fault tests
//! of durable signals and fenced checkpoints.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "crash.rs"]
    pub(crate) mod crash;
}

mod crash;
mod signals_checkpoints_crash;
mod workflows_crash;
