//! A job's execution log: appended and updated under the claim's token.

use super::marks::fenced_update;
use super::{Statement, alias, owned, table_ref};
use crate::columns::quote;
use crate::sql::table::StoreParams;
use sea_query::{Expr, Query};
use workerutil::MAX_EXECUTION_LOG_ENTRIES;

/// Appends an execution log entry (filling in `start_time` from the database
/// clock when absent) and returns the new length of the log. A log that holds
/// `MAX_EXECUTION_LOG_ENTRIES` already matches no row, as a lost lease does;
/// [`log_len`] tells the two apart.
pub(crate) fn log_append(o: &StoreParams, id: i64, token: i64, entry_json: String) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let logs = format!("{}.{}", quote(a), quote(&c.execution_logs));
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.execution_logs),
            Expr::cust_with_values(
                format!(
                    "COALESCE({logs}, '{{}}'::json[]) || (jsonb_build_object('start_time', now()) || $1::jsonb)::json"
                ),
                [entry_json],
            ),
        )
        .and_where(Expr::cust_with_values(
            format!("COALESCE(array_length({logs}, 1), 0) < $1"),
            [i64::try_from(MAX_EXECUTION_LOG_ENTRIES).unwrap_or(i64::MAX)],
        ))
        .returning(Query::returning().expr(Expr::cust(format!(
            "COALESCE(array_length({}, 1), 0)::bigint AS \"len\"",
            quote(&c.execution_logs)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// The length of a claimed job's execution log, if the lease still owns it.
pub(crate) fn log_len(o: &StoreParams, id: i64, token: i64) -> Statement {
    let t = &o.table;
    let q = Query::select()
        .expr(Expr::cust(format!(
            "COALESCE(array_length({}.{}, 1), 0)::bigint AS \"len\"",
            quote(&t.alias),
            quote(&o.columns.execution_logs)
        )))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned();
    Statement::from(&q)
}

/// Replaces the log entry at 0-based `index`, keeping its `start_time` unless
/// the new entry sets one.
pub(crate) fn log_update(
    o: &StoreParams,
    id: i64,
    token: i64,
    index: usize,
    entry_json: String,
) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let logs = format!("{}.{}", quote(a), quote(&c.execution_logs));
    let pos = i64::try_from(index).unwrap_or(i64::MAX - 1) + 1;
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.execution_logs),
            Expr::cust_with_values(
                format!(
                    "ARRAY(SELECT CASE WHEN u.o = $1 THEN (jsonb_build_object('start_time', u.e -> 'start_time') || $2::jsonb)::json ELSE u.e END FROM unnest({logs}) WITH ORDINALITY AS u(e, o) ORDER BY u.o)"
                ),
                [sea_query::Value::from(pos), sea_query::Value::from(entry_json)],
            ),
        )
        .and_where(Expr::cust_with_values(
            format!("COALESCE(array_length({logs}, 1), 0) >= $1"),
            [pos],
        ))
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let t = super::fixtures::resolved(false);
    vec![
        ("log_append", log_append(&t, 1, 2, "{}".into())),
        ("log_update", log_update(&t, 1, 2, 0, "{}".into())),
        ("log_len", log_len(&t, 1, 2)),
    ]
}
