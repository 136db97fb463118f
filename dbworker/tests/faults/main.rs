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

/// The heavy tests of signals_checkpoints_crash.rs take turns with its
/// latency-sensitive signals test: it runs alone (a writer), they may overlap
/// each other (readers). The killed workers of crash.rs and
/// workflows_crash.rs run alone too (writers), as they did in binaries of
/// their own, so that they and the timed tests do not share the machine.
static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod crash;
mod signals_checkpoints_crash;
mod workflows_crash;
