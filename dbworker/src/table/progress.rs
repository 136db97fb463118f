//! Where a table's jobs keep their progress and checkpoints, found at
//! start-up: the table's own columns (`dbworker migration --progress`), else
//! the side table `<table>_progress` (`--progress-table`, for a table its
//! owner cannot alter), each checked for the columns and types the
//! statements use.

use std::collections::HashMap;

use sqlx::PgPool;

use crate::columns::{CHECKPOINT, PROGRESS, PROGRESS_SEQ, progress_table};
use crate::error::Result;
use crate::schema_check::{Column, columns_of};
use crate::sql::Table;

/// The columns either storage has, with the types they must have.
const COLUMNS: [(&str, &str, &str); 3] = [
    (PROGRESS, "jsonb", "jsonb"),
    (CHECKPOINT, "jsonb", "jsonb"),
    (PROGRESS_SEQ, "int8", "bigint"),
];

/// Chooses the storage of `t`'s progress: its columns when it has all
/// three, else the side table when it exists. With `detect`, either turns
/// progress on; asked for (`JobTableOptions::progress`) and found in
/// neither, the problem names both ways to add it. `existing`: the table's
/// columns.
pub(super) async fn storage(
    pool: &PgPool,
    t: &mut Table,
    existing: &HashMap<String, Column>,
    detect: bool,
) -> Result<Vec<String>> {
    let in_columns = COLUMNS.iter().all(|(c, ..)| existing.contains_key(*c));
    let wanted = t.progress || t.progress_table.is_some();
    if !in_columns && (wanted || detect) {
        let side = progress_table(&t.table);
        let side_columns = columns_of(pool, &side).await?;
        if !side_columns.is_empty() {
            t.progress = false;
            t.progress_table = Some(side.clone());
            let name = side.display_name();
            let what = format!("progress table {name}");
            let mut found = problems(&side_columns, &what, &name, "--progress-table");
            if !side_columns.contains_key("job_id") {
                found.push(format!(
                    "{what} has no column job_id (progress; `dbworker migration --progress-table` creates it)"
                ));
            }
            return Ok(found);
        }
    }
    t.progress_table = None;
    t.progress = wanted || (detect && in_columns);
    if !t.progress {
        return Ok(Vec::new());
    }
    let table = t.table.display_name();
    let mut found = problems(existing, &format!("table {table}"), &table, "--progress");
    if !in_columns {
        found.push(format!(
            "table {table} keeps no progress: `dbworker migration --progress` adds its columns, `--progress-table` creates the side table {} for a table you cannot alter",
            progress_table(&t.table).display_name()
        ));
    }
    Ok(found)
}

/// What `columns` (of `what`, named `name` in messages) lacks or types
/// wrongly; `flag`: the migration flag that adds it.
fn problems(columns: &HashMap<String, Column>, what: &str, name: &str, flag: &str) -> Vec<String> {
    COLUMNS
        .iter()
        .filter_map(|(column, ty, expected)| match columns.get(*column) {
            None => Some(format!(
                "{what} has no column {column} (progress; `dbworker migration {flag}` adds it)"
            )),
            Some(c) if c.ty != *ty => Some(format!(
                "column {name}.{column} (progress) has type {}, expected {expected}",
                c.ty
            )),
            Some(_) => None,
        })
        .collect()
}
