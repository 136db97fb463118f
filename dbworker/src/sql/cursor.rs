//! The claim cursor's SQL (see `store/cursor.rs`): the condition that starts
//! a claim's index scan at the cursor, the key naming a set of conditions, and
//! the probe's looks: behind the cursor, and for jobs coming due (which
//! listening stores without a cursor make too).

use std::time::Duration;

use super::{Statement, alias, col, eligible, table_ref};
use crate::sql::cluster::since;
use crate::sql::control::{JOB_ROW, not_paused, table_row_through_view};
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, Order, PostgresQueryBuilder, Query};

/// `a.id >= $low`: the claim cursor's condition, ANDed into a claim so its
/// index scan starts at `low` (see `store/cursor.rs`).
pub(crate) fn claim_cursor_condition(o: &StoreParams, low: i64) -> Expr {
    col(&o.table.alias, &o.columns.id).gte(low)
}

/// The lowest eligible id below `before` that `conditions` admit: the claim
/// cursor's probe, which looks behind the cursor beside the claims.
pub(crate) fn eligible_behind(o: &StoreParams, conditions: &[Expr], before: i64) -> Statement {
    let (t, c) = (&o.table, &o.columns);
    let mut q = Query::select();
    q.expr_as(col(&t.alias, &c.id).min(), alias("id"))
        .from(table_ref(t))
        .cond_where(eligible(&t.alias, c))
        .and_where(col(&t.alias, &c.id).lt(before));
    for cond in conditions {
        q.and_where(cond.clone());
    }
    Statement::from(&q)
}

/// The lowest eligible `id` that `conditions` admit among the rows that came
/// due after `after` (seconds since the epoch on the database clock; without
/// it, within `first` before now), and the database clock now (`at`, the
/// next look's `after`): the probe's look, while a worker waits, for a job
/// coming due, which no notification announces. Paused queues' rows wait, as
/// the claims leave them. No index holds `process_after`: the look reads
/// past every queued row, as an empty claim does. Through a view, the
/// conditions read the view's columns, and the table's row is checked as a
/// claim checks it (eligible, its queue not paused).
pub(crate) fn came_due(
    o: &StoreParams,
    conditions: &[Expr],
    after: Option<f64>,
    first: Duration,
) -> Statement {
    let (t, c) = (&o.table, &o.columns);
    let cutoff = match after {
        Some(at) => Expr::cust_with_values("to_timestamp($1::float8)", [at]),
        None => since(first),
    };
    let mut q = Query::select();
    match &o.view {
        // The view need not show the layout's column: the table's row is
        // checked as a claim checks it.
        Some(v) => {
            q.expr(col(&v.alias, &c.id))
                .from(table_ref(v))
                .cond_where(eligible(&v.alias, &c.without_live()))
                .and_where(col(&v.alias, &c.process_after).gt(cutoff));
            let row = table_row_through_view(o, v, Some(eligible(JOB_ROW, c)));
            q.and_where(row.expect("the row is checked eligible"));
        }
        // In id order the claim index ends the scan at the first row found.
        None => {
            q.expr(col(&t.alias, &c.id))
                .from(table_ref(t))
                .cond_where(eligible(&t.alias, c))
                .and_where(col(&t.alias, &c.process_after).gt(cutoff))
                .order_by_expr(col(&t.alias, &c.id), Order::Asc);
        }
    }
    for cond in conditions {
        q.and_where(cond.clone());
    }
    if o.view.is_none()
        && let Some(e) = not_paused(o, &t.alias)
    {
        q.and_where(e);
    }
    q.limit(1);
    let mut outer = Query::select();
    outer
        .expr_as(Expr::cust("extract(epoch from now())::float8"), alias("at"))
        .expr_as(Expr::SubQuery(None, Box::new(q.into())), alias("id"));
    Statement::from(&outer)
}

/// Extra claim conditions as one text with their values inlined: a key that
/// tells claims with different conditions apart (never run as SQL).
pub(crate) fn conditions_key(conditions: &[Expr]) -> String {
    if conditions.is_empty() {
        return String::new();
    }
    let mut q = Query::select();
    for c in conditions {
        q.and_where(c.clone());
    }
    q.to_string(PostgresQueryBuilder)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{on_hot_layout, paused, rel, resolved};
    let t = resolved(false);
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    let cost_v = || Expr::cust_with_values("v.cost <= $1", [5]);
    let paused_view = || {
        let mut v = resolved(true);
        v.pause_table = Some(rel("dbworker_pauses"));
        v
    };
    let hot = on_hot_layout(resolved(false));
    let first = Duration::from_secs(60);
    vec![
        ("eligible_behind", eligible_behind(&t, &[cost()], 1000)),
        ("eligible_behind_hot", eligible_behind(&hot, &[], 1000)),
        ("came_due", came_due(&t, &[cost()], None, first)),
        ("came_due_since", came_due(&t, &[], Some(1.5e9), first)),
        (
            "came_due_unless_paused",
            came_due(&paused(), &[], None, first),
        ),
        ("came_due_hot", came_due(&hot, &[], None, first)),
        (
            "came_due_through_view",
            came_due(&resolved(true), &[cost_v()], None, first),
        ),
        (
            "came_due_through_view_hot_unless_paused",
            came_due(&on_hot_layout(paused_view()), &[], None, first),
        ),
    ]
}
