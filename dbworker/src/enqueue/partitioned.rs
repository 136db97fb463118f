//! The enqueuer on a partitioned job table: what it refuses at start-up
//! (workflows, keys without the key table) and keyed inserts through the key
//! table (`sql::enqueue_keyed_partitioned`), retried in a savepoint.

use sqlx::{Connection, PgConnection, PgPool};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql::{self, EnqueueTable};

use super::NewJob;

/// Checks a partitioned table for the enqueuer: workflows are refused by name
/// (the dependency table's foreign key needs a unique id), and with a key
/// column the key table must exist. Returns the key table, if keys are used.
pub(super) async fn check(
    pool: &PgPool,
    target: &EnqueueTable,
    workflows: bool,
) -> Result<Option<Relation>> {
    if workflows {
        return Err(Error::InvalidOption {
            field: "workflows",
            reason: format!(
                "workflows cannot run on {}, a partitioned table: the dependency table's foreign key needs a unique id, and a partitioned table's primary key is (id, queued_at)",
                target.table.display_name()
            ),
        });
    }
    if target.key.is_none() {
        return Ok(None);
    }
    // No unique index on the key alone: the key table stands in for it.
    let keys = crate::columns::key_table(&target.table);
    crate::schema_check::require_columns(
        pool,
        &keys,
        "key table",
        &["job_key", "job_id"],
        "a partitioned table keeps its job keys there; `dbworker migration --partitioned --keys` creates it",
    )
    .await?;
    Ok(Some(keys))
}

/// A keyed insert into a partitioned table, in a savepoint: `None` when a
/// concurrent enqueuer of the same key inserted first (the key table's
/// unique violation), so the caller looks again; else the statement's row
/// (none: a processing holder or a dedupe mode kept the key).
pub(super) async fn keyed_insert(
    conn: &mut PgConnection,
    target: &EnqueueTable,
    keys: &Relation,
    job: &NewJob,
    key: &str,
    mode: sql::OnKey,
) -> Result<Option<Option<sqlx::postgres::PgRow>>> {
    let mut savepoint = conn.begin().await.map_err(Error::db("begin"))?;
    let result = sql::enqueue_keyed_partitioned(target, keys, &job.row(), key, mode)
        .query()
        .fetch_optional(&mut *savepoint)
        .await;
    match result {
        Ok(row) => {
            savepoint.commit().await.map_err(Error::db("commit"))?;
            Ok(Some(row))
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
            savepoint.rollback().await.map_err(Error::db("rollback"))?;
            Ok(None)
        }
        Err(err) => Err(Error::db("enqueue")(err)),
    }
}
