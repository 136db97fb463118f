//! Results passed downstream: the upstream jobs a dependent waited for,
//! recorded when it is enqueued, and their results read back. (The handler's
//! result is written by its completion: `sql/marks.rs`.)

use super::{Statement, alias, col, plain_table, table_ref};
use crate::columns::quote;
use crate::columns::{TASK_NAME, UPSTREAM_IDS};
use crate::sql::table::{StoreParams, Table};
use sea_query::IntoIden;
use sea_query::{Expr, ExprTrait, Order, Query, TableRef};

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

/// The jobs job `id` waited for, one row each in id order: `up` its id,
/// `gone` whether its row no longer exists, `completed`, and the `name` (its
/// task name, or its id as text outside a workflow) and `result` of a
/// completed one. Primary-key lookups: the job's row, then each upstream's.
pub(crate) fn upstream_results(o: &StoreParams, result_column: &str, id: i64) -> Statement {
    let c = &o.columns;
    let uid = col("u", &c.id);
    let q = Query::select()
        .expr_as(Expr::cust("\"x\".\"up\""), alias("up"))
        .expr_as(uid.clone().is_null(), alias("gone"))
        .expr_as(
            Expr::cust(format!(
                "COALESCE(\"u\".{} = 'completed', false)",
                quote(&c.state)
            )),
            alias("completed"),
        )
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
        .join_lateral(
            sea_query::JoinType::InnerJoin,
            Query::select()
                .expr_as(
                    Expr::cust(format!("unnest(\"d\".{})", quote(UPSTREAM_IDS))),
                    alias("up"),
                )
                .to_owned(),
            alias("x"),
            Expr::cust("true"),
        )
        .join_as(
            sea_query::JoinType::LeftJoin,
            plain_table(&o.table),
            alias("u"),
            uid.equals(("x", "up")),
        )
        .and_where(col("d", &c.id).eq(id))
        .order_by(("x", "up"), Order::Asc)
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
