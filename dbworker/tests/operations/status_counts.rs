//! `Admin::status` counts every state per queue and in total on a table with
//! many finished rows, without a sequential scan of it: exact finished counts
//! through the retention index, the planner's estimate without it; and the
//! dashboard's overview, which shows them, scans nothing either.

use crate::common;
use crate::fixtures::router;

use std::collections::HashMap;
use std::time::Duration;

use dbworker::JobTable;
use dbworker::admin::{Admin, FinishedCounts, QueueCounts, Status};
use dbworker::ddl::{history_table_sql, workflows_sql};
use dbworker::history::DEFAULT_HISTORY_TABLE;
use sqlx::PgPool;

use common::Db;

/// 20,000 completed jobs and a few in every other state, in two queues:
/// emails: 4 queued due, 2 scheduled, 1 errored due, 1 errored later, 3
/// failed in the last hour; reports: 2 processing, 3 stalled, 2 pending, 2
/// failed two days ago, 1 canceled.
async fn seed(retention: bool) -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.retention = retention;
        },
        &[workflows_sql("jobs", &HashMap::new()).unwrap()],
    )
    .await;
    sqlx::raw_sql(
        "INSERT INTO jobs (state, queue, finished_at) SELECT 'completed', 'emails', now() - interval '2 hours' FROM generate_series(1, 20000);
         INSERT INTO jobs (state, queue, queued_at) SELECT 'queued', 'emails', now() - interval '90 seconds' FROM generate_series(1, 4);
         INSERT INTO jobs (state, queue, queued_at, process_after) SELECT 'queued', 'emails', now() - interval '1 day', now() + interval '1 hour' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, process_after) VALUES ('errored', 'emails', now() - interval '1 second'), ('errored', 'emails', now() + interval '1 hour');
         INSERT INTO jobs (state, queue, finished_at) SELECT 'failed', 'emails', now() - interval '10 minutes' FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue, started_at, last_heartbeat_at) SELECT 'processing', 'reports', now(), now() FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, started_at, last_heartbeat_at) SELECT 'processing', 'reports', now() - interval '1 hour', now() - interval '10 minutes' FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue, finished_at) SELECT 'failed', 'reports', now() - interval '2 days' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, finished_at) VALUES ('canceled', 'reports', now());
         WITH up AS (SELECT min(id) AS id FROM jobs WHERE state = 'processing'),
              p AS (INSERT INTO jobs (state, queue) SELECT 'pending', 'reports' FROM generate_series(1, 2) RETURNING id)
         INSERT INTO jobs_deps (job_id, depends_on) SELECT p.id, up.id FROM p, up;
         ANALYZE jobs;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

/// The admin on a pool of one connection, so the statistics read are its own.
async fn admin(db: &Db) -> (PgPool, Admin) {
    let pool = db.db.pool(1).await.unwrap();
    let mut o = Db::table_options();
    o.queue_column = Some("queue".into());
    o.workflows = true;
    let table = JobTable::new(&pool, o).await.unwrap();
    let admin = Admin::new(&pool, &table).await.unwrap();
    (pool, admin)
}

async fn seq_scans(pool: &PgPool) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `status` on `admin`, asserting it scanned nothing sequentially.
async fn status_without_a_scan(pool: &PgPool, admin: &Admin) -> Status {
    let before = seq_scans(pool).await;
    let status = admin.status_with(Duration::from_secs(60)).await.unwrap();
    assert_eq!(seq_scans(pool).await, before, "no sequential scan");
    sqlx::query("SELECT count(*) FROM jobs")
        .execute(pool)
        .await
        .unwrap();
    assert!(seq_scans(pool).await > before, "the counter sees a scan");
    status
}

/// The live counts of a queue: pending, queued, scheduled, available,
/// errored, processing, stalled.
fn live(q: &QueueCounts) -> [u64; 7] {
    [
        q.pending,
        q.queued,
        q.scheduled,
        q.available,
        q.errored,
        q.processing,
        q.stalled,
    ]
}

fn finished(q: &QueueCounts) -> [Option<u64>; 4] {
    [q.completed, q.failed, q.canceled, q.failed_last_hour]
}

#[tokio::test]
async fn every_state_is_counted_per_queue_and_in_total_without_a_scan() {
    let db = seed(true).await;
    let (pool, admin) = admin(&db).await;
    let status = status_without_a_scan(&pool, &admin).await;
    assert_eq!(status.finished, FinishedCounts::Exact);
    let names: Vec<_> = status.queues.iter().map(|q| q.queue.as_deref()).collect();
    assert_eq!(names, [Some("emails"), Some("reports")]);
    let (emails, reports) = (&status.queues[0], &status.queues[1]);
    assert_eq!(live(emails), [0, 6, 2, 5, 2, 0, 0]);
    assert_eq!(finished(emails), [Some(20_000), Some(3), Some(0), Some(3)]);
    assert_eq!(live(reports), [2, 0, 0, 0, 0, 5, 3]);
    assert_eq!(finished(reports), [Some(0), Some(2), Some(1), Some(0)]);
    assert_eq!(live(&status.total), [2, 6, 2, 5, 2, 5, 3]);
    assert_eq!(
        finished(&status.total),
        [Some(20_000), Some(5), Some(1), Some(3)]
    );
    // The oldest due job waited 90 s; the scheduled ones (a day) do not count.
    assert!(
        (89.0..600.0).contains(&status.oldest_waiting_seconds),
        "{}",
        status.oldest_waiting_seconds
    );
    // Every count agrees with a plain count of the rows.
    for (state, n) in [
        ("pending", 2),
        ("queued", 6),
        ("errored", 2),
        ("processing", 5),
        ("completed", 20_000),
        ("failed", 5),
        ("canceled", 1),
    ] {
        assert_eq!(db.count(state).await, n, "{state}");
    }
}

#[tokio::test]
async fn without_an_index_over_the_final_states_they_are_estimated_without_a_scan() {
    let db = seed(false).await;
    let (pool, admin) = admin(&db).await;
    let status = status_without_a_scan(&pool, &admin).await;
    assert_eq!(status.finished, FinishedCounts::Estimated);
    // Live states stay exact; finished ones are estimated in total only.
    assert_eq!(live(&status.total), [2, 6, 2, 5, 2, 5, 3]);
    for q in &status.queues {
        assert_eq!(finished(q), [None; 4], "{q:?}");
    }
    let completed = status.total.completed.unwrap();
    assert!((18_000..=22_000).contains(&completed), "{completed}");
    assert!(status.total.failed.is_some() && status.total.failed_last_hour.is_none());
}

/// The HOT layout's retention index reads `finished_at IS NOT NULL`, not the
/// state: the finished counts read it too, exactly, without a scan.
#[tokio::test]
async fn on_the_hot_layout_the_finished_counts_are_exact_through_its_retention_index() {
    let db = seed(true).await;
    let mut columns = dbworker::ddl::OptionalColumns::default();
    (columns.queue, columns.retention) = (true, true);
    db.execute(
        &(dbworker::ddl::hot_layout_sql("jobs", &HashMap::new(), columns).unwrap()
            + "ANALYZE jobs;"),
    )
    .await;
    let (pool, admin) = admin(&db).await;
    let status = status_without_a_scan(&pool, &admin).await;
    assert_eq!(status.finished, FinishedCounts::Exact);
    let (emails, reports) = (&status.queues[0], &status.queues[1]);
    assert_eq!(finished(emails), [Some(20_000), Some(3), Some(0), Some(3)]);
    assert_eq!(finished(reports), [Some(0), Some(2), Some(1), Some(0)]);
    assert_eq!(live(&status.total), [2, 6, 2, 5, 2, 5, 3]);
}

/// The history table with rows for `jobs` over the last 3 days (an hour
/// row 3 days back, minutes since): emails 40 completed, 3 failed;
/// reports 2 failed, 1 canceled; and a row of another job table, ignored.
async fn seed_history(db: &Db) {
    db.execute(&history_table_sql(DEFAULT_HISTORY_TABLE).unwrap())
        .await;
    sqlx::raw_sql(
        "INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed, failed, canceled) VALUES
           ('jobs', 'emails', to_timestamp(floor(EXTRACT(EPOCH FROM now() - interval '3 days') / 3600) * 3600), 3600, 30, 0, 0),
           ('jobs', 'emails', to_timestamp(floor(EXTRACT(EPOCH FROM now() - interval '10 minutes') / 60) * 60), 60, 10, 3, 0),
           ('jobs', 'reports', to_timestamp(floor(EXTRACT(EPOCH FROM now() - interval '2 days') / 3600) * 3600), 3600, 0, 2, 1),
           ('other', 'emails', now() - interval '20 days', 3600, 500, 500, 500);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn without_the_index_the_history_gives_the_finished_counts_per_queue() {
    let db = seed(false).await;
    seed_history(&db).await;
    let (pool, admin) = admin(&db).await;
    let status = admin
        .status_with_history(Duration::from_secs(60), DEFAULT_HISTORY_TABLE)
        .await
        .unwrap();
    let FinishedCounts::FromHistory { covered } = status.finished else {
        panic!("{:?}", status.finished);
    };
    // From the oldest row (3 days back, rounded down to the hour) to now.
    assert!(
        (3 * 86_400..3 * 86_400 + 3700).contains(&covered.as_secs()),
        "{covered:?}"
    );
    let (emails, reports) = (&status.queues[0], &status.queues[1]);
    assert_eq!(emails.queue.as_deref(), Some("emails"));
    assert_eq!(finished(emails), [Some(40), Some(3), Some(0), None]);
    assert_eq!(finished(reports), [Some(0), Some(2), Some(1), None]);
    assert_eq!(finished(&status.total), [Some(40), Some(5), Some(1), None]);
    // The live states are the table's, as without the history.
    assert_eq!(live(&status.total), [2, 6, 2, 5, 2, 5, 3]);
    // The dashboard's overview shows them, labelled with the period.
    let mut o = Db::table_options();
    o.queue_column = Some("queue".into());
    o.workflows = true;
    let table = JobTable::new(&pool, o).await.unwrap();
    let options = dbworker::dashboard::DashboardOptions::new(vec![table]);
    let dashboard = dbworker::dashboard::Dashboard::new(&pool, options)
        .await
        .unwrap();
    let (_, page) = router::get(&dashboard.router(), "/").await;
    assert!(
        page.contains("finished in the last 3d, from the history"),
        "{page}"
    );
    assert!(!page.contains("planner estimates"), "{page}");
    assert!(
        page.contains("<td class=\"num\">40</td><td class=\"num\">3</td><td class=\"num\">0</td>"),
        "{page}"
    );
}

#[tokio::test]
async fn the_history_is_read_only_without_the_index_or_when_it_exists() {
    // With the index: exact, whatever the history says.
    let db = seed(true).await;
    seed_history(&db).await;
    let (_, exact) = admin(&db).await;
    let status = exact
        .status_with_history(Duration::from_secs(60), DEFAULT_HISTORY_TABLE)
        .await
        .unwrap();
    assert_eq!(status.finished, FinishedCounts::Exact);
    assert_eq!(status.total.completed, Some(20_000));
    // Without the index nor a history table: the estimate, labelled so.
    let db = seed(false).await;
    let (pool, admin) = admin(&db).await;
    let status = admin
        .status_with_history(Duration::from_secs(60), DEFAULT_HISTORY_TABLE)
        .await
        .unwrap();
    assert_eq!(status.finished, FinishedCounts::Estimated);
    assert_eq!(finished(&status.queues[0]), [None; 4]);
    let mut o = Db::table_options();
    o.queue_column = Some("queue".into());
    let table = JobTable::new(&pool, o).await.unwrap();
    let options = dbworker::dashboard::DashboardOptions::new(vec![table]);
    let dashboard = dbworker::dashboard::Dashboard::new(&pool, options)
        .await
        .unwrap();
    let (_, page) = router::get(&dashboard.router(), "/").await;
    assert!(page.contains("planner estimates"), "{page}");
    assert!(!page.contains("from the history"), "{page}");
}

/// The dashboard's overview shows these counts without scanning the table
/// either, with or without the index over the final states.
#[tokio::test]
async fn the_dashboards_overview_counts_without_a_scan() {
    for retention in [true, false] {
        let db = seed(retention).await;
        let (pool, _) = admin(&db).await;
        let mut o = Db::table_options();
        o.queue_column = Some("queue".into());
        o.workflows = true;
        let table = JobTable::new(&pool, o).await.unwrap();
        let options = dbworker::dashboard::DashboardOptions::new(vec![table]);
        let dashboard = dbworker::dashboard::Dashboard::new(&pool, options)
            .await
            .unwrap();
        let before = seq_scans(&pool).await;
        let (status, page) = router::get(&dashboard.router(), "/").await;
        assert_eq!(status, axum::http::StatusCode::OK);
        assert!(page.contains("table class=\"state-counts\""), "{page}");
        // The emails row: pending, scheduled, available, errored, processing, stalled.
        assert!(
            page.contains("<td>emails</td><td class=\"num\">0</td><td class=\"num\">2</td><td class=\"num\">5</td><td class=\"num\">2</td><td class=\"num\">0</td><td class=\"num\">0</td>"),
            "{page}"
        );
        assert_eq!(
            seq_scans(&pool).await,
            before,
            "no sequential scan (retention index: {retention})"
        );
    }
}

/// "Oldest waiting" counts from when a job became runnable: a week-old job
/// requeued a minute ago (its `process_after` now) has waited a minute, not
/// a week.
#[tokio::test]
async fn the_oldest_wait_counts_from_when_the_job_became_runnable() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (state, queue, queued_at, process_after) VALUES ('queued', 'q', now() - interval '7 days', now() - interval '60 seconds')",
    )
    .await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let status = Admin::new(&db.pool, &table)
        .await
        .unwrap()
        .status()
        .await
        .unwrap();
    let oldest = status.oldest_waiting_seconds;
    assert!((59.0..3600.0).contains(&oldest), "{oldest}");
}
