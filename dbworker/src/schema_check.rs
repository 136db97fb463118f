//! The start-up check: the table, the view and every column exist with usable
//! types, and every configured SQL fragment is valid. All problems are
//! collected into one error.

use std::collections::HashMap;

use sqlx::{PgPool, Row};

use crate::columns::{Columns, Relation};
use crate::error::{Error, Result};
use crate::options::Resolved;
use crate::sql;

/// `column name → udt_name` of a relation; empty when it does not exist.
async fn columns_of(pool: &PgPool, rel: &Relation) -> Result<HashMap<String, String>> {
    let rows = sql::relation_columns(rel)
        .query()
        .fetch_all(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    Ok(rows
        .into_iter()
        .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
        .collect())
}

/// Checks that `rel` exists with every standard column, typed as expected.
pub(crate) async fn check_table(
    pool: &PgPool,
    rel: &Relation,
    columns: &Columns,
    problems: &mut Vec<String>,
) -> Result<()> {
    let table_columns = columns_of(pool, rel).await?;
    let table = rel.display_name();
    if table_columns.is_empty() {
        problems.push(format!("table {table} does not exist (or has no columns)"));
    } else {
        for (standard, name, types) in columns.expected_types() {
            let renamed = if standard == name {
                String::new()
            } else {
                format!(" (standard column {standard})")
            };
            match table_columns.get(name) {
                None => problems.push(format!("table {table} has no column {name}{renamed}")),
                Some(actual) if !types.contains(&actual.as_str()) => problems.push(format!(
                    "column {table}.{name}{renamed} has type {actual}, expected one of {}",
                    types.join(", ")
                )),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Checks the resolved options against the database.
pub(crate) async fn check(pool: &PgPool, o: &Resolved) -> Result<()> {
    let mut problems = Vec::new();
    check_table(pool, &o.table, &o.columns, &mut problems).await?;
    if let Some(view) = &o.view {
        let view_columns = columns_of(pool, view).await?;
        let name = view.display_name();
        if view_columns.is_empty() {
            problems.push(format!("view {name} does not exist (or has no columns)"));
        } else {
            for col in [&o.columns.id, &o.columns.state, &o.columns.process_after] {
                if !view_columns.contains_key(col.as_str()) {
                    problems.push(format!("view {name} has no column {col}"));
                }
            }
        }
    }
    // Only worth probing the SQL fragments once the relations are right.
    if problems.is_empty()
        && let Err(err) = sql::probe_expressions(o).query().execute(pool).await
    {
        let detail = match &err {
            sqlx::Error::Database(db) => db.message().to_owned(),
            other => other.to_string(),
        };
        problems.push(format!(
            "the column expressions or order_by are not valid against {}: {detail}",
            o.source().display_name()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema { problems })
    }
}
