//! Control of what is claimed: named queues, pauses, global limits, fair claims and flags.
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
    #[path = "router.rs"]
    pub(crate) mod router;
}

/// fairness.rs measures pickups against a baseline, which other tests'
/// claims would disturb: its tests run one at a time and alone (`write`), as
/// they did in a binary of their own; the other tests of this binary beside
/// each other (`read`).
static TIMED: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod fair_reschedule;
mod fairness;
mod flags;
mod limits;
mod paused_ahead;
mod pauses;
mod queues;
