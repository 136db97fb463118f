//! The start-up check of a partitioned job table: what it cannot carry
//! (workflows), and for job keys the key table and the triggers that keep it.

use sqlx::{PgPool, Row};

use crate::columns::{PARTITION_KEY_COLUMN, Relation, key_table, key_triggers};
use crate::error::{Error, Result};
use crate::schema_check as schema;
use crate::sql::{self, Table};

/// Workflows are refused by name (the dependency table's foreign key needs a
/// unique id). With a key column, the key table must exist and the triggers
/// that keep it must be there, enabled, and watch that column: without them
/// the key table stays empty and every keyed enqueue inserts a new job, so
/// "one live job per key" would break silently. Every such problem is named
/// at once. Returns the key table, if keys are used.
pub(super) async fn check(pool: &PgPool, t: &Table) -> Result<Option<Relation>> {
    if t.workflows {
        return Err(Error::InvalidOption {
            field: "workflows",
            reason: format!(
                "workflows cannot run on {}, a partitioned table: the dependency table's foreign key needs a unique id, and a partitioned table's primary key is (id, queued_at)",
                t.table.display_name()
            ),
        });
    }
    let Some(column) = &t.key_column else {
        return Ok(None);
    };
    let table = t.table.display_name();
    let migration = "`dbworker migration --partitioned --keys`";
    // No unique index on the key alone: the key table stands in for it.
    let keys = key_table(&t.table);
    let mut problems = schema::missing_columns(
        pool,
        &keys,
        "key table",
        &["job_key", "job_id"],
        &format!("a partitioned table keeps its job keys there; {migration} creates it"),
    )
    .await?;
    if column != PARTITION_KEY_COLUMN {
        problems.push(format!(
            "key column {table}.{column} (key_column) is not kept in the key table {}: on a partitioned table its triggers watch {PARTITION_KEY_COLUMN} only, so key_column must be {PARTITION_KEY_COLUMN} ({migration} adds it)",
            keys.display_name()
        ));
    }
    let found: Vec<(String, bool)> = sql::key_trigger_states(&t.table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("schema_check"))?
        .iter()
        .map(|r| (r.get("name"), r.get("enabled")))
        .collect();
    for trigger in key_triggers(&t.table) {
        match found.iter().find(|(name, _)| *name == trigger) {
            None => problems.push(format!(
                "table {table} has no trigger {trigger}, which keeps its job keys in {}; the migration's triggers are missing: run {migration}",
                keys.display_name()
            )),
            Some((_, false)) => problems.push(format!(
                "trigger {trigger} on table {table} is disabled, so its job keys are not kept: ALTER TABLE {table} ENABLE TRIGGER {trigger}"
            )),
            Some((_, true)) => {}
        }
    }
    schema::none(problems)?;
    Ok(Some(keys))
}
