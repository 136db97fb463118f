//! An operator's filter and page checked against the table before they reach
//! the driver: a column the table lacks, a key path into a column that is not
//! JSON and a malformed `after_value` are refused by name, quoting the input
//! cut short, instead of failing as a database error that echoes it whole.

use std::collections::HashMap;

use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::job_filter::{FieldFilter, JobSort, PageRequest, excerpt};
use crate::sql;

/// Every field filter names a column of `table`, and a key path only a JSON
/// one. Reads the catalog (one cheap query) only when there are fields, and
/// on every call, so a column added since start-up is found.
pub(super) async fn check_fields(
    pool: &PgPool,
    table: &Relation,
    fields: &[FieldFilter],
) -> Result<()> {
    if fields.is_empty() {
        return Ok(());
    }
    let types: HashMap<String, String> = sql::relation_columns(table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("field filter columns"))?
        .iter()
        .map(|r| (r.get("name"), r.get("type")))
        .collect();
    for f in fields {
        let reason = match types.get(&f.column) {
            None => format!(
                "{} has no column {}",
                table.display_name(),
                excerpt(&f.column)
            ),
            Some(ty) if !f.path.is_empty() && ty != "json" && ty != "jsonb" => format!(
                "column {} is {ty}, not JSON: a key path (column.key=value) needs a json or jsonb column",
                excerpt(&f.column)
            ),
            Some(_) => continue,
        };
        return Err(Error::InvalidOption {
            field: "fields",
            reason,
        });
    }
    Ok(())
}

/// A list's statement failed: a data exception (SQLSTATE class 22) can only
/// come from casting `after_value` to the sort's type, so it is the caller's
/// input at fault, reported without the driver's text (which quotes it whole).
pub(super) fn list_error(page: &PageRequest, err: sqlx::Error) -> Error {
    let bad_value = match (&err, &page.after_value) {
        (sqlx::Error::Database(db), Some(value)) if page.sort != JobSort::Id => db
            .code()
            .filter(|code| code.starts_with("22"))
            .map(|_| value),
        _ => None,
    };
    let Some(value) = bad_value else {
        return Error::Database {
            op: "list",
            source: err,
        };
    };
    let expected = match page.sort {
        JobSort::Failures => "a whole number",
        _ => "a timestamp",
    };
    Error::InvalidOption {
        field: "after_value",
        reason: format!(
            "{} is not {expected} (sorting by {}, pass the after_value the previous page gave)",
            excerpt(value),
            page.sort.as_str()
        ),
    }
}
