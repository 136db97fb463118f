//! Retention beside the job history: a purger given the history's options
//! purges a finished row only once the history has recorded its minute (or
//! once it is older than the history's `catch_up`), so a `max_age` shorter
//! than the history's `settle` plus its `interval` loses no job from the
//! charts; in batches and by dropping partitions. Time is moved by writing
//! rows with past timestamps, never by sleeping.
//!
//! Before, a `max_age` of a second purged a job finished 10 s ago, whose
//! minute the history (settling for a minute) had not yet recorded: it was
//! never counted.

use crate::common;
use crate::fixtures::purge as shared;

use std::time::Duration;

use dbworker::ddl::history_table_sql;
use dbworker::history::{DEFAULT_HISTORY_TABLE, History, HistoryOptions};
use dbworker::maintenance::{PurgeOptions, Purger};
use dbworker::{JobTable, JobTableOptions};
use workerutil::JobState;

use common::Db;
use shared::{completed, exists};

/// The history's options: catching up an hour back.
fn history_options() -> HistoryOptions {
    let mut o = HistoryOptions::default();
    o.catch_up = Duration::from_secs(3600);
    o.downsample_after = Duration::from_secs(3 * 3600);
    o
}

/// Completed jobs go a second after they finish; with `history`, once it
/// recorded them.
fn purge_options(history: Option<HistoryOptions>) -> PurgeOptions {
    let mut o = PurgeOptions::new();
    o.max_age = vec![(JobState::Completed, Duration::from_secs(1))];
    o.history = history;
    o
}

#[tokio::test]
async fn a_purger_beside_the_history_purges_only_what_it_recorded() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.retention = true,
        &[history_table_sql(DEFAULT_HISTORY_TABLE).unwrap()],
    )
    .await;
    let (fresh, settled, old) = (
        completed(&db, "10 seconds").await,
        completed(&db, "3 minutes").await,
        completed(&db, "3 hours").await,
    );
    let table = JobTable::new(&db.pool, JobTableOptions::detected("jobs"))
        .await
        .unwrap();
    let history = History::new(&db.pool, &table, history_options())
        .await
        .unwrap();
    let purger = Purger::new(&db.pool, &table, purge_options(Some(history_options())))
        .await
        .unwrap();

    // Nothing recorded yet: only the job past the history's catch-up goes.
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.by_state, [(JobState::Completed, 1)]);
    assert!(!exists(&db, old).await);
    assert!(exists(&db, settled).await && exists(&db, fresh).await);

    // The history records the settled minute: it is counted, then purged.
    assert_eq!(history.record_once().await.unwrap().minutes, 1);
    let counted: i64 = sqlx::query_scalar(
        "SELECT sum(completed)::bigint FROM dbworker_history WHERE job_table = 'jobs'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(counted, 1);
    assert_eq!(purger.purge_once().await.unwrap().total(), 1);
    assert!(!exists(&db, settled).await);
    // The fresh one waits for its minute to settle and be recorded.
    assert!(exists(&db, fresh).await);
    assert_eq!(purger.purge_once().await.unwrap().total(), 0);

    // A purger not told of the history takes it at once, unrecorded.
    let blind = Purger::new(&db.pool, &table, purge_options(None))
        .await
        .unwrap();
    assert_eq!(blind.purge_once().await.unwrap().total(), 1);
    assert!(!exists(&db, fresh).await);
}

/// On a partitioned table a closed partition holding a row the history has
/// not recorded is not dropped; once the history's records pass it, it is.
#[tokio::test]
async fn a_partition_holding_an_unrecorded_row_is_not_dropped() {
    let db = Db::partitioned().await;
    db.execute(&history_table_sql(DEFAULT_HISTORY_TABLE).unwrap())
        .await;
    // Queued yesterday (a closed partition), finished 10 s ago.
    let fresh = completed(&db, "10 seconds").await;
    let partition: String =
        sqlx::query_scalar("SELECT tableoid::regclass::text FROM jobs WHERE id = $1")
            .bind(fresh)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let table = JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap();
    let purger = Purger::new(&db.pool, &table, purge_options(Some(history_options())))
        .await
        .unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert!(
        !purged
            .partitions_dropped
            .iter()
            .any(|p| p.name.ends_with(partition.as_str())),
        "{purged:?}"
    );
    assert!(exists(&db, fresh).await);

    // The history's records now reach past it (a minute row from now on).
    db.execute(
        "INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed)
         VALUES ('jobs', '', date_trunc('minute', now()), 60, 1)",
    )
    .await;
    let purged = purger.purge_once().await.unwrap();
    assert!(
        purged
            .partitions_dropped
            .iter()
            .any(|p| p.name.ends_with(partition.as_str())),
        "{purged:?}"
    );
    assert!(!exists(&db, fresh).await);
}
