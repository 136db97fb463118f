//! What the dashboard's search suggests: the values a column (the queue, the
//! kind) takes among the live jobs and the newest rows, at a bounded cost on
//! a table of any size.

use super::{Statement, Table, alias, col, state, table_ref};
use sea_query::{Expr, ExprTrait, Order, Query, UnionType};
use workerutil::JobState;

/// The distinct values of `column` (as text, sorted, at most 200) among
/// 10,000 live jobs at most (through the partial indexes on the live states,
/// in no order: a backlog of millions costs the same) and the 1,000 newest
/// rows (through the primary key): `(v)`.
pub(crate) fn suggest_values(a: &Table, column: &str) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let value = || col(&t.alias, column).cast_as("text");
    let recent = Query::select()
        .expr_as(value(), alias("v"))
        .from(table_ref(t))
        .order_by_expr(col(&t.alias, &c.id), Order::Desc)
        .limit(1000)
        .to_owned();
    let live = Query::select()
        .expr_as(value(), alias("v"))
        .from(table_ref(t))
        .and_where(
            col(&t.alias, &c.state)
                .is_in([JobState::Queued, JobState::Errored, JobState::Processing].map(state)),
        )
        .limit(10_000)
        .to_owned();
    let both = Query::select()
        .column(alias("v"))
        .from_subquery(live, alias("live"))
        .union(
            UnionType::Distinct,
            Query::select()
                .column(alias("v"))
                .from_subquery(recent, alias("recent"))
                .to_owned(),
        )
        .to_owned();
    let q = Query::select()
        .column(alias("v"))
        .from_subquery(both, alias("s"))
        .and_where(Expr::col(alias("v")).is_not_null())
        .order_by(alias("v"), Order::Asc)
        .limit(200)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let a = super::fixtures::admin_table();
    vec![("suggest_values", suggest_values(&a, "queue"))]
}
