//! The crash tests' worker options, shared by dbworker/tests/faults/crash.rs and
//! dbworker-cli/tests/services/crash.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use workerutil::WorkerOptions;

/// Fast polls and heartbeats, and a short heartbeat failure limit.
pub fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.interval = Duration::from_millis(50);
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    o
}
