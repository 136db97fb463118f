//! The purger's partition work on a partitioned job table: creating upcoming
//! partitions, and dropping whole partitions whose every row is purgeable
//! instead of deleting their rows in batches.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Row, Transaction};
use workerutil::JobState;

use super::purger::PurgeTarget;
use crate::cluster::Leadership;
use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::metrics::{PARTITIONS_DROPPED_TOTAL, PURGED_TOTAL};
use crate::sql;

/// A transaction for partition DDL: a leader's is fenced by its term, so a
/// leader deposed meanwhile (paused past its lease) creates and drops
/// nothing ([`Error::LeadershipLost`]).
async fn begin(
    pool: &PgPool,
    fence: Option<&Leadership>,
) -> Result<Transaction<'static, Postgres>> {
    match fence {
        Some(leadership) => leadership.begin().await,
        None => pool.begin().await.map_err(Error::db("begin")),
    }
}

/// Creates the partitions up to `ahead` intervals past the current one
/// (`<table>_create_partitions`); returns the names of those it created, or
/// the lock error when the job table's lock was not granted within
/// `lock_timeout` (a long transaction holds the table): claims and enqueues
/// queue behind a waiting `CREATE … PARTITION OF`, so it waits no longer.
pub(crate) async fn create_ahead(
    pool: &PgPool,
    table: &Relation,
    ahead: u32,
    lock_timeout: Duration,
    fence: Option<&Leadership>,
) -> Result<std::result::Result<Vec<String>, sqlx::Error>> {
    // The fence comes first: its lock wait is not the creation's to time out.
    let mut tx = begin(pool, fence).await?;
    sql::set_lock_timeout(lock_timeout)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("create_partitions"))?;
    let rows = match sql::create_partitions(table, ahead)
        .fetch_all(&mut *tx)
        .await
    {
        Ok(rows) => rows,
        // lock_not_available: the rollback leaves every partition to later.
        Err(err) if crate::error::has_sqlstate(&err, "55P03") => return Ok(Err(err)),
        Err(err) => return Err(Error::db("create_partitions")(err)),
    };
    tx.commit().await.map_err(Error::db("commit"))?;
    Ok(Ok(rows.iter().map(|r| r.get("partition")).collect()))
}

/// Whether the table has its `<table>_create_partitions` function.
pub(crate) async fn has_create_function(pool: &PgPool, table: &Relation) -> Result<bool> {
    sql::create_partitions_exists(table)
        .fetch_one(pool)
        .await
        .map(|r| r.get("exists"))
        .map_err(Error::db("schema_check"))
}

/// A partition dropped whole, with how many rows it held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DroppedPartition {
    /// The partition's name (schema-qualified when not on the search path's
    /// first schema, as `regclass` prints it).
    pub name: String,
    /// The rows it held (deleted, or moved to the archive table).
    pub rows: u64,
}

/// Drops every closed partition (its range ended before now) whose every row
/// is purgeable under `max_age`, oldest first.
///
/// A first look, without locks, skips partitions that keep a row (a live job,
/// a young or unlisted final state): their purgeable rows go the batch way.
/// Then, in one transaction under `lock_timeout`, the partition is detached
/// (which locks it and the job table), its rows are counted again (no one can
/// change them now), and it is dropped only if still every row is purgeable;
/// otherwise the transaction rolls back and the partition stays attached. A
/// live job is never dropped. A lock not granted in time, or any other error
/// on one partition, skips it until the next pass; but a leader's term found
/// over ends the pass with [`Error::LeadershipLost`] (each drop is logged and
/// counted as it happens, so the drops before it are not lost).
pub(crate) async fn drop_purgeable(
    pool: &PgPool,
    target: &PurgeTarget,
    max_age: &[(JobState, Duration)],
    lock_timeout: Duration,
    fence: Option<&Leadership>,
) -> Result<Vec<DroppedPartition>> {
    // Both series exist from the first pass, drops or not.
    let table = target.table.display_name();
    let partitions_dropped = metrics::counter!(PARTITIONS_DROPPED_TOTAL, "table" => table.clone());
    let rows_dropped =
        metrics::counter!(PURGED_TOTAL, "table" => table.clone(), "state" => "partition");
    partitions_dropped.increment(0);
    rows_dropped.increment(0);
    let rows = sql::closed_partitions(&target.table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("purge"))?;
    let mut dropped = Vec::new();
    for row in rows {
        let name: String = row.get("name");
        let partition = Relation {
            schema: Some(row.get("schema")),
            alias: name.clone(),
            name,
        };
        let keeps: bool = sql::partition_keeps_rows(
            &partition,
            &target.columns,
            max_age,
            target.history.as_ref(),
        )
        .fetch_one(pool)
        .await
        .map_err(Error::db("purge"))?
        .get("kept");
        if keeps {
            continue;
        }
        // One partition that cannot go (a view depends on it, a privilege is
        // missing) stays attached, and its rows go the batch way: the others
        // and the batches must not wait for it.
        match detach_and_drop(pool, &partition, target, max_age, lock_timeout, fence).await {
            Ok(Some(rows)) => {
                let name = partition.display_name();
                partitions_dropped.increment(1);
                rows_dropped.increment(rows);
                tracing::info!(table = %table, partition = %name, rows, "partition dropped");
                dropped.push(DroppedPartition { name, rows });
            }
            Ok(None) => {}
            Err(err @ Error::LeadershipLost { .. }) => return Err(err),
            Err(err) => {
                tracing::warn!(partition = %partition.display_name(), error = %err, "partition not dropped; its rows go the batch way, and the next pass tries again");
            }
        }
    }
    Ok(dropped)
}

/// `(rows, kept)` of a partition, on `conn`.
async fn count(
    conn: &mut sqlx::PgConnection,
    partition: &Relation,
    target: &PurgeTarget,
    max_age: &[(JobState, Duration)],
) -> Result<(u64, u64)> {
    let row = sql::partition_rows(partition, &target.columns, max_age, target.history.as_ref())
        .fetch_one(conn)
        .await
        .map_err(Error::db("purge"))?;
    let (rows, kept): (i64, i64) = (row.get("rows"), row.get("kept"));
    Ok((rows as u64, kept as u64))
}

/// Detaches, re-checks and drops one partition in one transaction; `None`
/// when it was left attached (a row to keep, or the lock not granted in time).
async fn detach_and_drop(
    pool: &PgPool,
    partition: &Relation,
    target: &PurgeTarget,
    max_age: &[(JobState, Duration)],
    lock_timeout: Duration,
    fence: Option<&Leadership>,
) -> Result<Option<u64>> {
    // The fence comes first: its lock wait is not the detach's to time out.
    let mut tx = begin(pool, fence).await?;
    sql::set_lock_timeout(lock_timeout)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("purge"))?;
    match sql::detach_partition(&target.table, partition)
        .execute(&mut *tx)
        .await
    {
        Ok(_) => {}
        // lock_not_available: claims or long transactions hold the table.
        Err(err) if crate::error::has_sqlstate(&err, "55P03") => {
            tracing::info!(partition = %partition.display_name(), "partition not detached: the job table's lock was not granted in time; next pass");
            return Ok(None);
        }
        Err(err) => return Err(Error::db("detach partition")(err)),
    }
    let (rows, kept) = count(&mut tx, partition, target, max_age).await?;
    if kept > 0 {
        // A row changed between the first look and the detach: keep it all.
        tx.rollback().await.map_err(Error::db("rollback"))?;
        return Ok(None);
    }
    if let Some(archive) = &target.archive {
        sql::archive_partition(archive, partition)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("archive partition"))?;
    }
    sql::drop_partition(partition)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("drop partition"))?;
    tx.commit().await.map_err(Error::db("commit"))?;
    Ok(Some(rows))
}
