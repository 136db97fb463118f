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

/// Turns the layout on for `t` when the table has [`LIVE`]; returns what is
/// wrong with that column, if anything (`JobTable::new` then fails, naming it).
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
/// the live states", if it is not. Only the forms PostgreSQL prints for the
/// DDL of `hot_layout_sql` pass, over a text or varchar state column: a
/// claim trusts the column, and a look for the state names would let `NOT`,
/// `AND false` or `<> ALL` through.
fn wrong_expression(expression: &str, state_column: &str) -> Option<String> {
    // Spacing aside (both sides alike, so a quoted name's spaces cancel out).
    let squeeze = |text: &str| text.split_whitespace().collect::<String>();
    let squeezed = squeeze(expression);
    let plain = state_column
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let mut names = vec![quote(state_column)];
    if plain {
        names.push(state_column.to_owned());
    }
    let fits = names.iter().any(|name| {
        let text = format!(
            "({name} = ANY (ARRAY['queued'::text, 'errored'::text, 'processing'::text]))"
        );
        let varchar = format!(
            "(({name})::text = ANY ((ARRAY['queued'::character varying, 'errored'::character varying, 'processing'::character varying])::text[]))"
        );
        squeezed == squeeze(&text) || squeezed == squeeze(&varchar)
    });
    if fits {
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
        let varchar = "((\"Job State\")::text = ANY ((ARRAY['queued'::character varying, 'errored'::character varying, 'processing'::character varying])::text[]))";
        assert_eq!(wrong_expression(varchar, "Job State"), None);
        assert!(wrong_expression(pg, "status").is_some());
        for wrong in [
            "(state = ANY (ARRAY['queued'::text, 'processing'::text]))",
            "(state <> ALL (ARRAY['queued'::text, 'errored'::text, 'processing'::text]))",
            "(NOT (state = ANY (ARRAY['queued'::text, 'errored'::text, 'processing'::text])))",
            "((state = ANY (ARRAY['queued'::text, 'errored'::text, 'processing'::text])) AND false)",
        ] {
            assert!(wrong_expression(wrong, "state").is_some(), "{wrong}");
        }
    }
}
