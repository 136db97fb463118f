//! The enqueuer on a partitioned job table: keyed inserts through the key
//! table (`sql::enqueue_keyed_partitioned`), retried in a savepoint. What a
//! partitioned table refuses (workflows, keys without the key table) is
//! checked by `JobTable::new`.

use sqlx::{Connection, PgConnection};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql::{self, Table};

use super::NewJob;

/// A keyed insert into a partitioned table, in a savepoint: `None` when a
/// concurrent enqueuer of the same key inserted first (the key table's
/// unique violation), so the caller looks again; else the statement's row
/// (none: a processing holder or a dedupe mode kept the key).
pub(super) async fn keyed_insert(
    conn: &mut PgConnection,
    target: &Table,
    keys: &Relation,
    job: &NewJob,
    key: &str,
    mode: sql::OnKey,
) -> Result<Option<Option<sqlx::postgres::PgRow>>> {
    let mut savepoint = conn.begin().await.map_err(Error::db("begin"))?;
    let result = sql::enqueue_keyed_partitioned(target, keys, &job.row(), key, mode)
        .fetch_optional(&mut *savepoint)
        .await;
    match result {
        Ok(row) => {
            savepoint.commit().await.map_err(Error::db("commit"))?;
            Ok(Some(row))
        }
        // unique_violation in the key table: another live job took the key
        // meanwhile. One from an index of the application's own is its error.
        Err(err)
            if crate::error::has_sqlstate(&err, "23505")
                && err.as_database_error().and_then(|e| e.table()) == Some(keys.name.as_str()) =>
        {
            savepoint.rollback().await.map_err(Error::db("rollback"))?;
            Ok(None)
        }
        Err(err) => Err(Error::db("enqueue")(err)),
    }
}
