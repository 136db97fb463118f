//! Retention on real Postgres: old finished rows go (deleted or archived) in
//! batches, per-state ages hold, live rows are never touched, and a running
//! purger purges every interval until it is stopped. The archive and
//! `dbworker purge --once`: dbworker-cli/tests/services/purge.rs.

use crate::common;
use crate::fixtures::purge as shared;

use dbworker::Service;
use dbworker::maintenance::{PurgeOptions, Purger};
use workerutil::JobState;
use workerutil::Store as _;

use common::Db;
use shared::seed;

#[tokio::test]
async fn old_finished_rows_go_in_batches_and_live_rows_stay() {
    let db = Db::new().await;
    seed(&db).await;
    let mut o = PurgeOptions::new();
    o.chunk_size = 2;
    let purger = Purger::new(&db.pool, &db.table().await, o).await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(
        purged.by_state,
        [
            (JobState::Completed, 5),
            (JobState::Failed, 3),
            (JobState::Canceled, 1)
        ]
    );
    // Recent finished rows and every live row (an errored job will run again)
    // are still there.
    for (state, left) in [
        ("completed", 2),
        ("failed", 1),
        ("canceled", 0),
        ("queued", 2),
        ("processing", 1),
        ("errored", 1),
    ] {
        assert_eq!(db.count(state).await, left, "{state}");
    }
    assert_eq!(purger.purge_once().await.unwrap().total(), 0);
}

/// A purged job's signals go with it, in the same statement; a live job's
/// mailbox is untouched. A purger without DELETE on the mailbox is refused
/// at start-up, naming it.
#[tokio::test]
async fn a_purged_jobs_signals_go_with_it() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    seed(&db).await;
    db.execute(
        "INSERT INTO jobs_signals (job_id, name) SELECT id, 'paid' FROM jobs;
         DO $$ BEGIN CREATE ROLE purge_only_signals_read; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT SELECT, UPDATE, DELETE ON jobs TO purge_only_signals_read;
         GRANT SELECT ON jobs_signals TO purge_only_signals_read;",
    )
    .await;
    let table = db.table_with(|o| o.signals = true).await;
    let purger = Purger::new(&db.pool, &table, PurgeOptions::new())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 9);
    let (left, orphans): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.job_id)) FROM jobs_signals s",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (left, orphans),
        (7, 0),
        "the kept jobs' signals stay, the purged ones' go"
    );

    let options: sqlx::postgres::PgConnectOptions = db.db.url().parse().unwrap();
    let restricted = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET ROLE purge_only_signals_read")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(options)
        .await
        .unwrap();
    let err = Purger::new(&restricted, &table, PurgeOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("DELETE") && err.contains("jobs_signals"),
        "{err}"
    );
}

/// `run` purges at once, again each interval, and ends when its token fires.
#[tokio::test]
async fn run_purges_every_interval_until_stopped() {
    use std::time::Duration;
    use tokio::time::{Instant, timeout};

    let db = Db::new().await;
    seed(&db).await;
    let mut o = PurgeOptions::new();
    o.interval = Duration::from_millis(100);
    let purger = Purger::new(&db.pool, &db.table().await, o).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { purger.run(stop).await.unwrap() }
    });
    let until_completed = |left: i64| {
        let db = &db;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while db.count("completed").await != left {
                assert!(
                    Instant::now() < deadline,
                    "completed rows never came to {left}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    until_completed(2).await;
    db.execute(
        "INSERT INTO jobs (state, finished_at) VALUES ('completed', now() - interval '10 days')",
    )
    .await;
    until_completed(2).await;
    stop.cancel();
    timeout(Duration::from_secs(2), run)
        .await
        .expect("a stop ends the wait between passes")
        .unwrap();
}

/// With the id column renamed, the purge still finds the purged jobs'
/// mailbox rows and side-table rows by the moved rows' id (it once named
/// the table's column where the deleted rows expose `id`).
#[tokio::test]
async fn a_renamed_id_column_purges_the_mailbox_and_the_side_table_too() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    seed(&db).await;
    db.execute(
        "INSERT INTO jobs_signals (job_id, name) SELECT id, 'paid' FROM jobs;
         INSERT INTO jobs_progress (job_id, progress) SELECT id, '{}' FROM jobs;
         ALTER TABLE jobs RENAME COLUMN id TO job_ref;",
    )
    .await;
    let table = db
        .table_with(|o| {
            o.signals = true;
            o.progress = true;
            o.alternate_column_names
                .insert("id".into(), "job_ref".into());
        })
        .await;
    assert!(table.has_progress(), "the side table is detected");
    let purger = Purger::new(&db.pool, &table, PurgeOptions::new())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 9);
    for side in ["jobs_signals", "jobs_progress"] {
        let (left, orphans): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS \
             (SELECT 1 FROM jobs j WHERE j.job_ref = s.job_id)) FROM {side} s"
        )))
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((left, orphans), (7, 0), "{side}");
    }
}

/// On the HOT layout the archive takes whole rows with the live column (as
/// a plain one, what `LIKE` copies): an archive made before the layout is
/// named at start-up, rather than failing every pass.
#[tokio::test]
async fn the_hot_layouts_archive_is_checked_at_start_up_and_takes_its_rows() {
    let db = Db::hot().await;
    seed(&db).await;
    db.execute(
        "CREATE TABLE old_archive (LIKE jobs); ALTER TABLE old_archive DROP COLUMN dbworker_live;
         CREATE TABLE archive (LIKE jobs);",
    )
    .await;
    let mut o = PurgeOptions::new();
    o.archive_table = Some("old_archive".into());
    let Err(err) = Purger::new(&db.pool, &db.table().await, o).await else {
        panic!("an archive without the live column is refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("archive table old_archive has no column dbworker_live"),
        "{err}"
    );
    // `INCLUDING ALL` copies the column as generated: the archive's insert
    // of whole rows would fail with 428C9 at every purge.
    db.execute("CREATE TABLE generated_archive (LIKE jobs INCLUDING ALL);")
        .await;
    let mut o = PurgeOptions::new();
    o.archive_table = Some("generated_archive".into());
    let Err(err) = Purger::new(&db.pool, &db.table().await, o).await else {
        panic!("an archive whose live column is generated is refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("column generated_archive.dbworker_live of the archive table is generated"),
        "{err}"
    );
    let mut o = PurgeOptions::new();
    o.archive_table = Some("archive".into());
    let purger = Purger::new(&db.pool, &db.table().await, o).await.unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 9);
    let archived: i64 = sqlx::query_scalar("SELECT count(*) FROM archive WHERE NOT dbworker_live")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(archived, 9);
}

/// The archive is compared with the job table's columns at start-up: the
/// columns a migration added to the table but not to the archive are named,
/// all at once, rather than failing every batch; and rows are copied by
/// column name, so an archive with the same columns in another order gets
/// each value in its own column.
#[tokio::test]
async fn an_archive_missing_a_column_is_refused_and_one_in_another_order_gets_each_value_right() {
    let db = Db::new().await;
    seed(&db).await;
    db.execute("CREATE TABLE old_archive (LIKE jobs);").await;
    db.add_columns(
        |c| {
            c.kind = true;
            c.priority = true;
        },
        &[],
    )
    .await;
    let mut o = PurgeOptions::new();
    o.archive_table = Some("old_archive".into());
    let Err(err) = Purger::new(&db.pool, &db.table().await, o).await else {
        panic!("an archive without the table's new columns is refused");
    };
    let err = err.to_string();
    for column in ["kind", "priority"] {
        assert!(
            err.contains(&format!("archive table old_archive has no column {column}")),
            "{err}"
        );
    }
    // The same columns, last first.
    shared::reversed_archive(&db, "reversed_archive").await;
    db.execute("UPDATE jobs SET kind = 'k' || id, priority = id;")
        .await;
    let before = shared::rows_as_json(&db, "jobs").await;
    let mut o = PurgeOptions::new();
    o.archive_table = Some("reversed_archive".into());
    let purger = Purger::new(&db.pool, &db.table().await, o).await.unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 9);
    let archived = shared::rows_as_json(&db, "reversed_archive").await;
    assert_eq!(archived.len(), 9);
    for row in &archived {
        assert!(before.contains(row), "{row} is not a row of the job table");
    }
}

/// A completed job an unfinished dependent waited for stays, however old:
/// the dependent (waiting for a slower upstream) reads its result when it
/// runs. It goes once the dependent has finished, as does one whose
/// dependents all finished.
#[tokio::test]
async fn a_completed_upstream_stays_while_a_dependent_has_not_finished() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    // 1 completed 8 days ago, 2 due tomorrow, 3 waits for both; 4 completed
    // as long ago, its only dependent 5 done.
    db.execute(
        "INSERT INTO jobs (id, state, finished_at, process_after, has_dependents, upstream_ids) VALUES
           (1, 'completed', now() - interval '8 days', NULL, true, NULL),
           (2, 'queued', NULL, now() + interval '1 day', true, NULL),
           (3, 'pending', NULL, NULL, false, '{1,2}'),
           (4, 'completed', now() - interval '8 days', NULL, true, NULL),
           (5, 'completed', now() - interval '8 days', NULL, false, '{4}');
         INSERT INTO jobs_deps (job_id, depends_on) VALUES (3, 2);",
    )
    .await;
    let table = db.table_with(|o| o.workflows = true).await;
    let purger = Purger::new(&db.pool, &table, PurgeOptions::new())
        .await
        .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 2, "4 and 5");
    assert_eq!(db.state(1).await, "completed", "3 still needs 1");
    db.execute("UPDATE jobs SET state = 'completed', finished_at = now() - interval '8 days' WHERE id IN (2, 3)")
        .await;
    assert_eq!(purger.purge_once().await.unwrap().total(), 3, "1, 2 and 3");
}

/// An upstream job whose row is gone (deleted by hand) is an error naming
/// it, not a map of results that looks complete; an upstream that did not
/// complete is still left out.
#[tokio::test]
async fn upstream_results_name_an_upstream_whose_row_is_gone() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    db.add_columns(|c| c.results = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (id, state, finished_at, result, has_dependents, upstream_ids) VALUES
           (1, 'completed', now(), '\"one\"', true, NULL),
           (2, 'failed', now(), NULL, true, NULL),
           (4, 'queued', NULL, NULL, false, '{1,2}'),
           (5, 'queued', NULL, NULL, false, '{1,2,3}');",
    )
    .await;
    let table = db
        .table_with(|o| {
            o.workflows = true;
            o.result_column = Some("result".into());
        })
        .await;
    let store = db.store_on(&table, db.options()).await;
    let mut jobs = store.dequeue("host", &Default::default(), 2).await.unwrap();
    jobs.sort_by_key(|j| j.record().id);
    let [mut four, mut five] = <[_; 2]>::try_from(jobs).unwrap();
    for job in [&mut four, &mut five] {
        assert!(store.open(job).await.unwrap());
    }
    let read = four.upstream_results(&store).await.unwrap();
    assert_eq!(
        read.into_iter().collect::<Vec<_>>(),
        [("1".to_owned(), serde_json::json!("one"))]
    );
    let err = five.upstream_results(&store).await.unwrap_err();
    assert!(
        matches!(&err, dbworker::Error::UpstreamGone { job: 5, ids } if ids == &[3]),
        "{err}"
    );
}
