//! Results passed downstream: the upstream jobs a dependent waited for,
//! recorded when it is enqueued, and their results read back. (The handler's
//! result is written by its completion: `sql/marks.rs`.)

use super::{Statement, alias, col, plain_table, state, table_ref};
use crate::columns::quote;
use crate::columns::{TASK_NAME, UPSTREAM_IDS};
use crate::sql::table::{StoreParams, Table};
use sea_query::IntoIden;
use sea_query::{Expr, ExprTrait, Order, Query, TableRef};
use workerutil::JobState;

/// Records, on each new dependent, the jobs it waits for
/// (`dependents[i]` waits for `upstream[i]`), so it can read their results
/// once they completed: the edges themselves are gone by then.
pub(crate) fn record_upstreams(w: &Table, dependents: Vec<i64>, upstream: Vec<i64>) -> Statement {
    let t = &w.table;
    let a = &t.alias;
    let pairs = Query::select()
        .expr_as(
            Expr::cust_with_values("unnest($1::bigint[])", [dependents]),
            alias("d"),
        )
        .expr_as(
            Expr::cust_with_values("unnest($1::bigint[])", [upstream]),
            alias("u"),
        )
        .to_owned();
    let per_dependent = Query::select()
        .expr_as(col("x", "d"), alias("id"))
        .expr_as(Expr::cust("array_agg(DISTINCT \"x\".\"u\")"), alias("ids"))
        .from_subquery(pairs, alias("x"))
        .group_by_col((alias("x"), alias("d")))
        .to_owned();
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(UPSTREAM_IDS), col("dbworker_ups", "ids"))
        .from(TableRef::SubQuery(
            Box::new(per_dependent),
            alias("dbworker_ups").into_iden(),
        ))
        .and_where(col(a, &w.columns.id).equals(("dbworker_ups", "id")))
        .to_owned();
    Statement::from(&q)
}

/// The results of the jobs job `id` waited for, each named by its task name
/// (its id as text outside a workflow): two primary-key lookups, the job's
/// row and each upstream's, through `= ANY(upstream_ids)`.
pub(crate) fn upstream_results(o: &StoreParams, result_column: &str, id: i64) -> Statement {
    let c = &o.columns;
    let q = Query::select()
        .expr_as(
            Expr::cust(format!(
                "COALESCE(\"u\".{}, \"u\".{}::text)",
                quote(TASK_NAME),
                quote(&c.id)
            )),
            alias("name"),
        )
        .expr_as(col("u", result_column), alias("result"))
        .from_as(plain_table(&o.table), alias("d"))
        .join_as(
            sea_query::JoinType::InnerJoin,
            plain_table(&o.table),
            alias("u"),
            Expr::cust(format!(
                "\"u\".{} = ANY(\"d\".{})",
                quote(&c.id),
                quote(UPSTREAM_IDS)
            )),
        )
        .and_where(col("d", &c.id).eq(id))
        .and_where(col("u", &c.state).eq(state(JobState::Completed)))
        .order_by_expr(col("u", &c.id), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{with_results, workflow_table};
    let (r, w) = (with_results(), workflow_table());
    vec![
        ("upstream_results", upstream_results(&r, "result", 7)),
        (
            "record_upstreams",
            record_upstreams(&w, vec![3, 3], vec![1, 2]),
        ),
    ]
}
