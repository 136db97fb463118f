//! The claim cursor's SQL (see `store/cursor.rs`): the condition that starts
//! a claim's index scan at the cursor, the key naming a set of conditions, and
//! the probe's look for the lowest eligible row (which stores without a
//! cursor make too, when they listen).

use std::time::Duration;

use super::{Statement, alias, col, eligible, table_ref};
use crate::sql::cluster::since;
use crate::sql::control::not_paused;
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, Order, PostgresQueryBuilder, Query};

/// `a.id >= $low`: the claim cursor's condition, ANDed into a claim so its
/// index scan starts at `low` (see `store/cursor.rs`).
pub(crate) fn claim_cursor_condition(o: &StoreParams, low: i64) -> Expr {
    col(&o.table.alias, &o.columns.id).gte(low)
}

/// Where the probe looks for the lowest eligible row.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Look {
    /// Anywhere.
    Anywhere,
    /// Below this id: behind the cursor.
    Behind(i64),
    /// Above this id, among the rows that came due within the window: past
    /// an eligible row the claims leave (a limit binds, a lock).
    CameDueAfter(i64),
}

/// The lowest eligible row that `conditions` admit, where `look` says: its
/// `id`, and `came_due` (whether its `process_after` passed within `window`).
/// The claim cursor's probe, which looks behind the cursor beside the claims
/// and, for a store that can wake its workers, ahead of it too: a job coming
/// due is announced by nobody, while an older eligible row must not wake
/// them at every look.
pub(crate) fn first_eligible(
    o: &StoreParams,
    conditions: &[Expr],
    look: Look,
    window: Duration,
) -> Statement {
    let (t, c) = (&o.table, &o.columns);
    let due = col(&t.alias, &c.process_after);
    let mut q = Query::select();
    q.expr_as(col(&t.alias, &c.id), alias("id"))
        .expr_as(
            due.clone().is_not_null().and(due.gt(since(window))),
            alias("came_due"),
        )
        .from(table_ref(t))
        .cond_where(eligible(&t.alias, c));
    let id = col(&t.alias, &c.id);
    match look {
        Look::Anywhere => {}
        Look::Behind(low) => {
            q.and_where(id.lt(low));
        }
        Look::CameDueAfter(after) => {
            let due = col(&t.alias, &c.process_after);
            q.and_where(id.gt(after)).and_where(due.gt(since(window)));
        }
    }
    for cond in conditions {
        q.and_where(cond.clone());
    }
    // A paused queue's rows wait, as the claim leaves them: no wake-up.
    if let Some(e) = not_paused(o, &t.alias) {
        q.and_where(e);
    }
    q.order_by_expr(col(&t.alias, &c.id), Order::Asc).limit(1);
    Statement::from(&q)
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
    use super::fixtures::{on_hot_layout, paused, resolved};
    let t = resolved(false);
    let window = Duration::from_secs(2);
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    let hot = on_hot_layout(resolved(false));
    vec![
        (
            "first_eligible_behind",
            first_eligible(&t, &[cost()], Look::Behind(1000), window),
        ),
        (
            "first_eligible",
            first_eligible(&t, &[], Look::Anywhere, window),
        ),
        (
            "first_eligible_came_due",
            first_eligible(&t, &[], Look::CameDueAfter(1000), window),
        ),
        (
            "first_eligible_unless_paused",
            first_eligible(&paused(), &[], Look::Anywhere, window),
        ),
        (
            "first_eligible_behind_hot",
            first_eligible(&hot, &[], Look::Behind(1000), window),
        ),
    ]
}
