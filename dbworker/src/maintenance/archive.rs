//! The purger's archive table, checked at start-up: archiving copies every
//! column of the job table into it by name, so each must be there, and none
//! of them generated.

use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::schema_check;
use crate::sql::{self, Archive, Table};

/// The archive `table` of `t`'s rows, with the job table's columns read now,
/// and what is wrong with it: each column it lacks is named (a migration
/// that added columns to the job table after the archive was made would
/// otherwise fail every batch, and only in the log).
pub(crate) async fn check(
    pool: &PgPool,
    t: &Table,
    table: Relation,
) -> Result<(Archive, Vec<String>)> {
    let hint = format!(
        "CREATE TABLE {} (LIKE {})",
        table.display_name(),
        t.table.display_name()
    );
    let columns = schema_check::column_names(pool, &t.table).await?;
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    let mut problems =
        schema_check::missing_columns(pool, &table, "archive table", &names, &hint).await?;
    // On the HOT layout the rows include the live column, which the archive
    // must take as a plain one: `LIKE … INCLUDING ALL` copies it as
    // generated, which refuses the insert (428C9) at every purge.
    let live = crate::columns::LIVE;
    if t.columns.live
        && let Some(row) = sql::generated_column(&table, live)
            .fetch_optional(pool)
            .await
            .map_err(Error::db("schema_check"))?
        && !row.get::<String, _>("generated").is_empty()
    {
        problems.push(format!(
            "column {}.{live} of the archive table is generated, so archiving whole rows fails (428C9): make it a plain column ({hint}, or ALTER TABLE {} ALTER COLUMN {live} DROP EXPRESSION)",
            table.display_name(),
            table.display_name()
        ));
    }
    Ok((Archive { table, columns }, problems))
}
