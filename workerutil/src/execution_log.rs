//! Execution log entries: what a handler ran and what it printed.

use serde::{Deserialize, Serialize};

/// The most entries one attempt's execution log may hold. Every store refuses
/// the next append with [`Error::ExecutionLogFull`](crate::Error::ExecutionLogFull);
/// updating an existing entry is always allowed, and a new attempt starts with an
/// empty log.
///
/// The Postgres store keeps the log in one array column and each append rewrites
/// it, so appends get slower as the log grows (10,000 appends once took 114 s);
/// the cap bounds that cost. Log a long-running step as one entry and update it.
pub const MAX_EXECUTION_LOG_ENTRIES: usize = 1000;

/// One entry of a job's execution log (the most recent attempt's log is kept).
///
/// A handler appends an entry when it starts a step and updates it in place when
/// the step ends. `start_time` is filled in by the store from its own clock when
/// left empty, so every timestamp comes from one clock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecutionLogEntry {
    /// A short name for the step, e.g. `"step.clone"`.
    pub key: String,
    /// The command (or description) that was run.
    #[serde(default)]
    pub command: Vec<String>,
    /// When the step started, as RFC 3339 text; the store sets it when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// The exit code, once the step ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What the step printed.
    #[serde(default)]
    pub out: String,
    /// How long the step took, in milliseconds, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}
