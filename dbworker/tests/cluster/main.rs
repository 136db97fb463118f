//! Many processes: the worker registry and the leader (paused past its lease), and cron
//! schedules, their failures, time zones and crontab files.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "cron.rs"]
    pub(crate) mod cron;
    #[path = "nodes.rs"]
    pub(crate) mod nodes;
}

/// leader_pause.rs times leases on a 2-core machine: its tests run one at a
/// time and alone (`write`), as they did in a binary of their own; the other
/// tests of this binary beside each other (`read`).
static TIMED: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod cron;
mod cron_failures;
mod cron_time_zones;
mod crontab;
mod leader_pause;
mod nodes;
