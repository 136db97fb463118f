//! What the dashboard's search suggests: the values a column (the queue, the
//! kind) takes among the live jobs and the newest rows, at a bounded cost on
//! a table of any size.

use super::{Statement, Table};
use crate::columns::quote;

/// The distinct values of `column` (as text, sorted, at most 200) among the
/// live jobs (through the partial indexes on the live states) and the 1,000
/// newest rows (through the primary key): `(v)`.
pub(crate) fn suggest_values(a: &Table, column: &str) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let table = t.quoted();
    let (col, state, id) = (quote(column), quote(&c.state), quote(&c.id));
    let sql = format!(
        "SELECT \"v\" FROM (\
         SELECT {col}::text AS \"v\" FROM {table} WHERE {state} IN ('queued', 'errored', 'processing') \
         UNION \
         SELECT \"recent\".\"v\" FROM (SELECT {col}::text AS \"v\" FROM {table} ORDER BY {id} DESC LIMIT 1000) AS \"recent\"\
         ) AS \"s\" WHERE \"v\" IS NOT NULL ORDER BY \"v\" LIMIT 200"
    );
    Statement {
        sql: sql.into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let a = super::fixtures::admin_table();
    vec![("suggest_values", suggest_values(&a, "queue"))]
}
