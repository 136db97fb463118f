//! `Table`: the job table as every statement sees it (the one resolved form of
//! the public `JobTable`), and `StoreParams`: a store's claim and mark settings
//! over it.

use std::sync::Arc;

use crate::columns::{Columns, Relation, quote};
use crate::retry::{RetryPolicy, RetryRule};
use crate::sql::history::ErrorHistory;

/// A job table with its names resolved and checked: the relation, the view
/// records are read through, the renamed standard columns, the optional
/// columns it has and its control tables. Built by `JobTable::new`; every
/// service's statements read this one value.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub(crate) table: Relation,
    /// The view records are read through, if any.
    pub(crate) view: Option<Relation>,
    pub(crate) columns: Columns,
    pub(crate) queue_column: Option<String>,
    pub(crate) kind_column: Option<String>,
    pub(crate) key_column: Option<String>,
    pub(crate) priority_column: Option<String>,
    pub(crate) max_retries_column: Option<String>,
    /// The `text[]` flags column (over the view's alias when reading through one).
    pub(crate) flags_column: Option<String>,
    /// The `jsonb` payload column: typed jobs' arguments, batch jobs' items.
    pub(crate) payload_column: Option<String>,
    /// The `jsonb` column completions write the handler's result to, if any.
    pub(crate) result_column: Option<String>,
    /// The per-attempt error history failing marks append to, if kept.
    pub(crate) error_history: Option<ErrorHistory>,
    /// The table has workflows (`workflow_id`, the dependency table).
    pub(crate) workflows: bool,
    /// The table has `upstream_ids`: dependents record the jobs they wait for.
    pub(crate) upstream_ids: bool,
    /// A partitioned table's key table (`<table>_keys`): keyed inserts go
    /// through it, since the table can have no unique index on the key.
    pub(crate) key_table: Option<Relation>,
    pub(crate) pause_table: Option<Relation>,
    pub(crate) limit_table: Option<Relation>,
    pub(crate) limit_key_column: Option<String>,
    /// What a store reads of each claimed row (empty: `alias.*`).
    pub(crate) column_expressions: Vec<String>,
    /// The claim's `ORDER BY` over the source's alias (`None`: by id).
    pub(crate) order_by: Option<String>,
    /// A fair table's weight table (`dbworker migration --fair`): its jobs
    /// carry `fair_key`, `fair_tag` and `fair_cost`, and claims order by tag.
    pub(crate) fair_weights: Option<Relation>,
    /// A fair table whose trigger tags untagged jobs come due (`dbworker
    /// migration --fair` of this version): the store has them tagged.
    pub(crate) fair_due: bool,
    /// Priority aging: the claim ranks each level's head by its wait.
    pub(crate) aging: Option<AgingParams>,
    /// The table has `progress`, `checkpoint` and `progress_seq`
    /// (`dbworker migration --progress`): completions drop the checkpoint.
    pub(crate) progress: bool,
    /// The side table `<table>_progress` that keeps progress and
    /// checkpoints instead (`dbworker migration --progress-table`), when
    /// the table has no progress columns; never both.
    pub(crate) progress_table: Option<Relation>,
    /// The mailbox, when jobs may wait for signals (`dbworker migration
    /// --signals`): the table has `awaiting`, claims clear it.
    pub(crate) signals: Option<Relation>,
    /// The table has `traceparent`, `tracestate` and `trace_follows`
    /// (`dbworker migration --traces`): enqueues store the trace context,
    /// claims read it, marks record the attempt's span.
    pub(crate) traces: bool,
    /// A table with traces and signals whose mailbox has `traceparent`
    /// (`dbworker migration --signals` adds it): senders store their span
    /// there and the attempt consuming a signal links to it.
    pub(crate) signal_traces: bool,
    /// The optional columns set (queue, kind, payload) that the view leaves
    /// out: what reads them through the view (`QueueWorkers`' claims, a
    /// client's typed reads and kinds) refuses to start, naming them.
    pub(crate) view_lacks: Vec<String>,
}

/// Priority aging as the claim reads it (`JobTableOptions::aging`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AgingParams {
    /// How long a job waits to rise one level, in seconds.
    pub(crate) interval_secs: f64,
    /// The most levels a job rises (`None`: up to the top level waiting).
    pub(crate) max_boost: Option<u32>,
}

impl Table {
    /// `table` with `columns` and none of the optional parts.
    pub(crate) fn new(table: Relation, columns: Columns) -> Table {
        Table {
            table,
            view: None,
            columns,
            queue_column: None,
            kind_column: None,
            key_column: None,
            priority_column: None,
            max_retries_column: None,
            flags_column: None,
            payload_column: None,
            result_column: None,
            error_history: None,
            workflows: false,
            upstream_ids: false,
            key_table: None,
            pause_table: None,
            limit_table: None,
            limit_key_column: None,
            column_expressions: Vec::new(),
            order_by: None,
            fair_weights: None,
            fair_due: false,
            aging: None,
            progress: false,
            progress_table: None,
            traces: false,
            signal_traces: false,
            signals: None,
            view_lacks: Vec::new(),
        }
    }

    /// Whether jobs keep progress and checkpoints, in the table's columns or
    /// in the side table.
    pub(crate) fn keeps_progress(&self) -> bool {
        self.progress || self.progress_table.is_some()
    }

    /// The relation records are read from: the view, or the table.
    pub(crate) fn source(&self) -> &Relation {
        self.view.as_ref().unwrap_or(&self.table)
    }

    /// `column` over the alias records are read under (`"j"."queue"`), as
    /// claim conditions and the select name it.
    pub(crate) fn read_column(&self, column: &str) -> String {
        format!("{}.{}", quote(&self.source().alias), quote(column))
    }

    /// The optional columns an insert may write.
    pub(crate) fn insert_columns(&self) -> impl Iterator<Item = &str> {
        [
            &self.key_column,
            &self.queue_column,
            &self.priority_column,
            &self.max_retries_column,
            &self.kind_column,
            &self.flags_column,
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
    }
}

/// What a store's claims, marks and resets need beyond the table: how it reads
/// and orders records and how it retries. Derefs to the shared [`Table`].
#[derive(Debug, Clone)]
pub(crate) struct StoreParams {
    pub(crate) shared: Arc<Table>,
    pub(crate) column_expressions: Vec<String>,
    pub(crate) order_by: String,
    pub(crate) max_num_retries: u32,
    pub(crate) retry: RetryPolicy,
    pub(crate) max_num_resets: u32,
    pub(crate) candidate_window: usize,
}

impl StoreParams {
    /// The store's retry rule, with what a kind's `over` sets in its place.
    pub(crate) fn retry_rule(&self, over: Option<&workerutil::Retry>) -> RetryRule {
        RetryRule::resolve(self.max_num_retries, &self.retry, over)
    }
}

impl std::ops::Deref for StoreParams {
    type Target = Table;

    fn deref(&self) -> &Table {
        &self.shared
    }
}

/// Tests change a store's table in place (copied on write).
#[cfg(test)]
impl std::ops::DerefMut for StoreParams {
    fn deref_mut(&mut self) -> &mut Table {
        Arc::make_mut(&mut self.shared)
    }
}
