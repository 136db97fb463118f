//! Everything through PgBouncer in transaction mode: the services, the conformance suite, the
//! leader and cron, killed workers, jobs stopped mid-query, LISTEN, and jobs claimed ahead
//! meeting a pause.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "ahead.rs"]
    pub(crate) mod ahead;
    #[path = "conformance.rs"]
    pub(crate) mod conformance;
    #[path = "consumers.rs"]
    pub(crate) mod consumers;
    #[path = "crash.rs"]
    pub(crate) mod crash;
    #[path = "dashboard.rs"]
    pub(crate) mod dashboard;
    #[path = "purge.rs"]
    pub(crate) mod purge;
    #[path = "router.rs"]
    pub(crate) mod router;
    #[path = "stuck.rs"]
    pub(crate) mod stuck;
}

/// `dbworker::set_pooler` is process-wide: every test of this binary that
/// sets it (or runs behind the pooler) holds this lock throughout, so the
/// tests take turns.
static POOLER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod pgbouncer;
mod pgbouncer_abandon;
mod pgbouncer_cluster;
mod pgbouncer_conformance;
mod pgbouncer_crash;
mod pgbouncer_listen;
mod pgbouncer_pauses;
mod pgbouncer_services;
