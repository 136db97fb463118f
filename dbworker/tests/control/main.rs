//! Control of what is claimed: named queues, pauses, global limits, fair claims and flags.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "router.rs"]
    pub(crate) mod router;
}

mod fairness;
mod flags;
mod limits;
mod pauses;
mod queues;
