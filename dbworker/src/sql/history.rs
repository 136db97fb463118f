//! The per-attempt error history: every failing mark (errored, failed, a
//! reset, a requeue after a lost connection) appends one entry to the job's
//! history column in the same fenced statement, so a stale mark appends nothing.

use super::alias;
use crate::columns::{Columns, quote};
use sea_query::{Expr, UpdateStatement};

/// The `jsonb` column failing marks append to, and how many entries it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorHistory {
    pub(crate) column: String,
    /// The most entries kept: older ones are dropped first.
    pub(crate) limit: u32,
}

/// The history column's new value for the row aliased `a`: its entries plus
/// `{attempt, at, message, worker, started}`, of which the last `limit` are
/// kept. `attempt` counts this one with the failures and resets before it
/// (the row's values before the update); `at` is the database clock;
/// `worker` the row's `worker_hostname` and `started` its `started_at`, as
/// the attempt's claim set them (the job page's timeline shows how long each
/// attempt ran).
///
/// Raw text: sea-query has no `jsonb_array_elements ... WITH ORDINALITY`
/// in a scalar subquery of an `UPDATE ... SET`.
pub(super) fn appended(h: &ErrorHistory, a: &str, c: &Columns, message: Expr) -> Expr {
    let q = |name: &str| format!("{}.{}", quote(a), quote(name));
    Expr::cust_with_exprs(
        format!(
            "(SELECT COALESCE(jsonb_agg(\"kept\".\"e\" ORDER BY \"kept\".\"n\"), '[]'::jsonb) FROM (SELECT \"h\".\"e\", \"h\".\"n\" FROM jsonb_array_elements(COALESCE({history}, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', COALESCE({failures}, 0) + COALESCE({resets}, 0) + 1, 'at', clock_timestamp(), 'message', ($1)::text, 'worker', {worker}, 'started', {started}))) WITH ORDINALITY AS \"h\"(\"e\", \"n\") ORDER BY \"h\".\"n\" DESC LIMIT $2) AS \"kept\")",
            history = q(&h.column),
            failures = q(&c.num_failures),
            resets = q(&c.num_resets),
            worker = q(&c.worker_hostname),
            started = q(&c.started_at),
        ),
        [message, Expr::val(i64::from(h.limit))],
    )
}

/// `update` also appends `message` to the history, when the table keeps one.
pub(super) fn append_history(
    update: &mut UpdateStatement,
    history: Option<&ErrorHistory>,
    a: &str,
    c: &Columns,
    message: Expr,
) {
    if let Some(h) = history {
        update.value(alias(&h.column), appended(h, a, c, message));
    }
}
