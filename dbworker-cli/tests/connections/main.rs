//! Connecting and setting up: bad inputs (TLS among them), bad counts and migrations, bad
//! configuration, least privilege, a replica and PgBouncer (a pause through it among them).
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
    #[path = "ahead.rs"]
    pub(crate) mod ahead;
    #[path = "replica.rs"]
    pub(crate) mod replica;
}

mod bad_counts_and_migrations;
mod bad_inputs;
mod least_privilege;
mod pgbouncer;
mod pgbouncer_pause;
mod replica;
mod robustness_config;
