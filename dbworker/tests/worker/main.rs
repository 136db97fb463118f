//! The worker over the Postgres store: claims, fencing, claim-ahead, the claim cursor, wake-ups,
//! transactional connections, faults at run time, and the conformance suite.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "conformance.rs"]
    pub(crate) mod conformance;
    #[path = "stuck.rs"]
    pub(crate) mod stuck;
}

mod claim_ahead;
mod claim_cursor;
mod conformance;
mod grouped_answers;
mod robustness_runtime;
mod transactional_connections;
mod transient_marks;
mod wakeups;
mod worker;
