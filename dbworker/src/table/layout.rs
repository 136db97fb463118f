//! The HOT layout (`dbworker migration --hot-layout`, issue 38): a table
//! whose only index on the state is `(id) WHERE dbworker_live`, over a
//! generated column that a claim leaves unchanged, and whose pages keep
//! room (`fillfactor`), so the claim is a HOT update. Found at start-up by
//! that column; its expression is checked, since a claim that trusted a
//! wrong one would skip rows it should take.

use std::collections::HashMap;

use sqlx::{PgPool, Row};

use crate::columns::{LIVE, quote};
use crate::error::{Error, Result};
use crate::schema_check::Column;
use crate::sql::{self, Table};

/// The states the generated column must hold true for, and those it must not.
const LIVE_STATES: [&str; 3] = ["queued", "errored", "processing"];
const OTHER_STATES: [&str; 4] = ["pending", "completed", "failed", "canceled"];

/// Turns the layout on for `t` when the table has [`LIVE`]; returns what is
/// wrong with that column, if anything (the layout then stays off).
pub(crate) async fn detect(
    pool: &PgPool,
    t: &mut Table,
    existing: &HashMap<String, Column>,
) -> Result<Vec<String>> {
    let Some(column) = existing.get(LIVE) else {
        return Ok(Vec::new());
    };
    let table = t.table.display_name();
    let row = sql::generated_column(&t.table, LIVE)
        .fetch_optional(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    let (generated, expression) = row
        .map(|r| {
            (
                r.get::<String, _>("generated"),
                r.get::<Option<String>, _>("expression").unwrap_or_default(),
            )
        })
        .unwrap_or_default();
    let problem = if column.ty != "bool" {
        Some(format!("has type {}, expected boolean", column.ty))
    } else if generated != "s" {
        Some("is not a stored generated column".to_owned())
    } else {
        wrong_expression(&expression, &t.columns.state)
    };
    if let Some(problem) = problem {
        return Ok(vec![format!(
            "column {table}.{LIVE} {problem}; the HOT layout needs `{LIVE} boolean GENERATED ALWAYS AS ({} IN ('queued', 'errored', 'processing')) STORED` (`dbworker migration --hot-layout` prints it)",
            quote(&t.columns.state)
        )]);
    }
    t.columns.live = true;
    Ok(Vec::new())
}

/// Why `expression` (as `pg_get_expr` prints it) is not "the state is one of
/// the live states", if it is not: it must read the state column and name
/// exactly those states.
fn wrong_expression(expression: &str, state_column: &str) -> Option<String> {
    let names_state = expression.contains(&quote(state_column))
        || expression
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == state_column);
    let has = |s: &str| expression.contains(&format!("'{s}'"));
    if names_state && LIVE_STATES.iter().all(|s| has(s)) && !OTHER_STATES.iter().any(|s| has(s)) {
        None
    } else {
        Some(format!(
            "computes {expression}, not whether the job is queued, errored or processing"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::wrong_expression;

    #[test]
    fn only_the_live_states_of_the_state_column_pass() {
        let pg = "(state = ANY (ARRAY['queued'::text, 'errored'::text, 'processing'::text]))";
        assert_eq!(wrong_expression(pg, "state"), None);
        let renamed = pg.replace("state", "\"Job State\"");
        assert_eq!(wrong_expression(&renamed, "Job State"), None);
        assert!(wrong_expression(pg, "status").is_some());
        let no_errored = "(state = ANY (ARRAY['queued'::text, 'processing'::text]))";
        assert!(wrong_expression(no_errored, "state").is_some());
        let with_pending = pg.replace("'processing'", "'processing'::text, 'pending'");
        assert!(wrong_expression(&with_pending, "state").is_some());
    }
}
