//! `StoreOptions` after validation, as the store and the SQL layer read them.

use std::time::Duration;

use super::ResetConfig;
use super::{ForbiddenFlags, Handling};
use crate::sql::{PerJob, StoreParams};

/// Options after validation, with names resolved. Derefs to the statement
/// parameters it holds, so the store reads `o.columns` as the SQL layer does.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) name: String,
    /// The name as a metric label: shared, so each operation's label is a
    /// reference count, not a copy.
    pub(crate) label: metrics::SharedString,
    /// What the job-table statements need.
    pub(crate) sql: StoreParams,
    /// The statements every transactional job runs, rendered once.
    pub(crate) per_job: PerJob,
    /// What the claims skip, when set.
    pub(crate) forbidden_flags: Option<ForbiddenFlags>,
    pub(crate) stalled_max_age: Duration,
    pub(crate) reset_failure_message: String,
    pub(crate) handling: Handling,
    /// The claim cursor's probe interval, when claims can use one.
    pub(crate) claim_cursor: Option<Duration>,
    /// The probe's interval, when it runs: with a claim cursor, or on a
    /// listening store without one (no view), to wake the workers for jobs
    /// coming due.
    pub(crate) probe: Option<Duration>,
    pub(crate) listen_channel: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_result_bytes: usize,
}

impl Resolved {
    /// What a reset pass over this store's table needs.
    pub(crate) fn reset_config(&self) -> ResetConfig {
        ResetConfig {
            table: self.table.clone(),
            columns: self.columns.clone(),
            stalled_max_age: self.stalled_max_age,
            max_num_resets: self.max_num_resets,
            message: self.reset_failure_message.clone(),
            dead_nodes: None,
            error_history: self.error_history.clone(),
        }
    }
}

impl std::ops::Deref for Resolved {
    type Target = StoreParams;

    fn deref(&self) -> &StoreParams {
        &self.sql
    }
}
