//! `JobTable`: what every job-table statement needs to know about the table.

use super::history::ErrorHistory;
use crate::columns::{Columns, Relation};
use crate::retry::{RetryPolicy, RetryRule};

/// The job table as the statements see it: names resolved and validated by the
/// store's options, plus the settings that shape the claim, marks and resets.
#[derive(Debug, Clone)]
pub(crate) struct JobTable {
    pub(crate) table: Relation,
    /// The view records are read through, if any.
    pub(crate) view: Option<Relation>,
    pub(crate) columns: Columns,
    pub(crate) column_expressions: Vec<String>,
    pub(crate) order_by: String,
    pub(crate) max_num_retries: u32,
    pub(crate) max_retries_column: Option<String>,
    pub(crate) retry: RetryPolicy,
    pub(crate) max_num_resets: u32,
    pub(crate) candidate_window: usize,
    pub(crate) pause_table: Option<Relation>,
    pub(crate) limit_table: Option<Relation>,
    pub(crate) limit_key_column: Option<String>,
    pub(crate) queue_column: Option<String>,
    /// The `text[]` flags column, over the view's (or table's) alias.
    pub(crate) flags_column: Option<String>,
    /// The `jsonb` payload column batch jobs rewrite, over the table's alias.
    pub(crate) payload_column: Option<String>,
    /// The per-attempt error history failing marks append to, if kept.
    pub(crate) error_history: Option<ErrorHistory>,
    /// The `jsonb` column completions write the handler's result to, if any.
    pub(crate) result_column: Option<String>,
}

impl JobTable {
    /// The store's retry rule, with what a kind's `over` sets in its place.
    pub(crate) fn retry_rule(&self, over: Option<&workerutil::Retry>) -> RetryRule {
        RetryRule::resolve(self.max_num_retries, &self.retry, over)
    }

    /// The relation records are read from: the view, or the table.
    pub(crate) fn source(&self) -> &Relation {
        self.view.as_ref().unwrap_or(&self.table)
    }
}
