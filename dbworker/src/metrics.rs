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

/// Store operations, by store, operation and outcome (counter). `op`:
/// `dequeue`, `open`, `heartbeat`, `complete`, `errored`, `failed`,
/// `canceled`, `snoozed`, `requeue`. `outcome`: `ok`, `empty` (a dequeue
/// that found nothing), `retry` and `failed` (an errored mark: retried, or
/// out of retries), `lost` (the claim was no longer this worker's),
/// `withheld` (an `open` that put the job back: its queue was paused while
/// it waited to start), `refused` (a completion or a wait refused for the
/// job's own reason, marked errored next), `requeued` (one not written for a
/// reason not the job's, put back), `error`.
pub const STORE_OPERATIONS_TOTAL: &str = "dbworker_store_operations_total";

/// How long each store operation took, in seconds, by store and operation
/// (histogram; a grouped mark counts the wait for its group).
pub const STORE_OPERATION_SECONDS: &str = "dbworker_store_operation_seconds";

/// Jobs claimed, by store (counter).
pub const CLAIMED_TOTAL: &str = "dbworker_claimed_total";

/// Jobs enqueued, by table and how (`one`, `many`, `copy`) (counter): the
/// jobs of calls that returned, so a job its key kept counts, and so does one
/// enqueued in a caller's transaction that later rolled back (the table's
/// rows are the exact count).
pub const ENQUEUED_TOTAL: &str = "dbworker_enqueued_total";

/// How long each enqueue call took, in seconds, by table and how (histogram).
pub const ENQUEUE_SECONDS: &str = "dbworker_enqueue_seconds";

/// How long each resetter pass took, in seconds, by table (histogram).
pub const RESET_PASS_SECONDS: &str = "dbworker_reset_pass_seconds";
