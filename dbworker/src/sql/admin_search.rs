//! A list page whose filter has a condition no index serves (the failure
//! text, payload fields): it looks at a bounded window of rows below the
//! cursor in id order, so a page costs the same however rare the matches.

use super::{Statement, Table, alias, table_ref};
use crate::columns::quote;
use crate::job_filter::{JobFilter, PageRequest};
use crate::sql::admin::list_select;
use crate::sql::admin_filter::filter_conditions;
use sea_query::{Expr, ExprTrait, Order, Query};

/// The window's row number (a name no job table is likely to have).
const N: &str = "dbworker_window_n";

/// Up to `page.size` jobs matching `f` among the `window` rows after the
/// cursor in id order (`page.sort` is the id), each with `matched` true;
/// and the window's last row (`n` = `window`) whether it matches or not,
/// which tells the caller the window was full and where it stopped. The
/// filter is applied outside the window (past its `LIMIT`), so Postgres
/// cannot push it down into an unbounded scan.
pub(crate) fn admin_list_window(
    a: &Table,
    f: &JobFilter,
    page: &PageRequest,
    window: u32,
) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let al = quote(&t.alias);
    let id = format!("{al}.{}", quote(&c.id));
    let (order, cmp, dir) = if page.newest_first {
        (Order::Desc, "<", "DESC")
    } else {
        (Order::Asc, ">", "ASC")
    };
    let mut inner = Query::select();
    inner
        .expr(Expr::cust(format!("{al}.*")))
        .expr_as(
            Expr::cust(format!("row_number() OVER (ORDER BY {id} {dir})")),
            alias(N),
        )
        .from(table_ref(t));
    if let Some(after) = page.after {
        inner.and_where(Expr::cust_with_values(format!("{id} {cmp} $1"), [after]));
    }
    inner
        .order_by_expr(Expr::cust(id.clone()), order.clone())
        .limit(u64::from(window));
    let matched = filter_conditions(a, f)
        .into_iter()
        .reduce(|x, y| x.and(y))
        .unwrap_or_else(|| Expr::cust("true"));
    let n = format!("{al}.{}", quote(N));
    // The match, as a column and as the condition (NULL counts as no match).
    let mut q = list_select(a);
    q.expr_as(Expr::cust("NULL::text"), alias("sort_value"))
        .expr_as(
            Expr::cust_with_expr("COALESCE($1, false)", matched.clone()),
            alias("matched"),
        )
        .expr_as(Expr::cust(format!("{n}::bigint")), alias("n"))
        .from_subquery(inner, alias(&t.alias))
        .and_where(matched.or(Expr::cust_with_values(
            format!("{n} = $1"),
            [i64::from(window)],
        )))
        .order_by_expr(Expr::cust(id), order)
        .limit(u64::from(page.size));
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use crate::job_filter::FieldFilter;
    let a = super::fixtures::admin_table();
    let filter = JobFilter {
        states: vec![workerutil::JobState::Failed],
        failure_contains: Some("timeout".into()),
        fields: vec![FieldFilter::new("payload", &["to", "domain"], "example.com").unwrap()],
        ..JobFilter::default()
    };
    let newest = PageRequest {
        after: Some(1000),
        newest_first: true,
        ..PageRequest::first(50)
    };
    vec![
        (
            "admin_list_window",
            admin_list_window(&a, &filter, &PageRequest::first(50), 50_000),
        ),
        (
            "admin_list_window_newest_first",
            admin_list_window(&a, &filter, &newest, 1000),
        ),
    ]
}
