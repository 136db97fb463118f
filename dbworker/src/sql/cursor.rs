//! The claim cursor's SQL (see `store/cursor.rs`): the condition that starts
//! a claim's index scan at the cursor, the key naming a set of conditions, and
//! the probe's look for the lowest eligible row (which stores without a
//! cursor make too, when they listen).

use super::{Statement, alias, col, eligible, table_ref};
use crate::sql::control::not_paused;
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, PostgresQueryBuilder, Query};

/// `a.id >= $low`: the claim cursor's condition, ANDed into a claim so its
/// index scan starts at `low` (see `store/cursor.rs`).
pub(crate) fn claim_cursor_condition(o: &StoreParams, low: i64) -> Expr {
    col(&o.table.alias, &o.columns.id).gte(low)
}

/// The lowest eligible id that `conditions` admit, below `before` if given:
/// the claim cursor's probe, which looks behind the cursor beside the claims
/// (and, for a store that can wake its workers, ahead of it too: a row coming
/// due there is announced by nobody).
pub(crate) fn first_eligible(
    o: &StoreParams,
    conditions: &[Expr],
    before: Option<i64>,
) -> Statement {
    let (t, c) = (&o.table, &o.columns);
    let mut q = Query::select();
    q.expr_as(col(&t.alias, &c.id).min(), alias("id"))
        .from(table_ref(t))
        .cond_where(eligible(&t.alias, c));
    if let Some(before) = before {
        q.and_where(col(&t.alias, &c.id).lt(before));
    }
    for cond in conditions {
        q.and_where(cond.clone());
    }
    // A paused queue's rows wait, as the claim leaves them: no wake-up.
    if let Some(e) = not_paused(o, &t.alias) {
        q.and_where(e);
    }
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
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    let hot = on_hot_layout(resolved(false));
    vec![
        (
            "first_eligible_behind",
            first_eligible(&t, &[cost()], Some(1000)),
        ),
        ("first_eligible", first_eligible(&t, &[], None)),
        (
            "first_eligible_unless_paused",
            first_eligible(&paused(), &[], None),
        ),
        (
            "first_eligible_behind_hot",
            first_eligible(&hot, &[], Some(1000)),
        ),
    ]
}
