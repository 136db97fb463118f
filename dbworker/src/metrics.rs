//! Every metric dbworker records, by name (the `metrics` crate's facade: install
//! any recorder, e.g. Prometheus). The worker's own metrics are in
//! [`workerutil::metrics`].

/// Live jobs per state and queue (metric name); labels `table`, `state`, `queue`.
pub const QUEUE_DEPTH: &str = "dbworker_queue_depth";

/// Seconds the oldest job of a state and queue has been queued (metric name).
pub const OLDEST_JOB_AGE_SECONDS: &str = "dbworker_oldest_job_age_seconds";

/// Stalled jobs the resetter put back in the queue (metric name).
pub const RESETS_TOTAL: &str = "dbworker_resets_total";

/// Stalled jobs the resetter failed for too many resets (metric name).
pub const RESET_FAILURES_TOTAL: &str = "dbworker_reset_failures_total";

/// Resetter passes that failed (metric name).
pub const RESET_ERRORS_TOTAL: &str = "dbworker_reset_errors_total";

/// Rows the purger deleted or archived, by table and state (metric name).
pub const PURGED_TOTAL: &str = "dbworker_purged_total";

/// Partitions the purger dropped whole, by table (metric name).
pub const PARTITIONS_DROPPED_TOTAL: &str = "dbworker_partitions_dropped_total";

/// Live processes in the registry, as the last heartbeat counted them (gauge).
pub const NODES_LIVE: &str = "dbworker_nodes_live";

/// 1 while this process leads the scope, else 0 (gauge, labels `scope`).
pub const LEADER: &str = "dbworker_leader";
