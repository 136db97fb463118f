//! The job history: three processes recording the same table count every
//! finished job once, percentiles per minute, downsampling old minutes into
//! hours with the same sums, retention, and the checks of `History::new`.
//! Time is moved by writing rows with past timestamps, never by sleeping.

use crate::common;
use crate::fixtures::history as shared;

use dbworker::Service;
use std::time::Duration;

use dbworker::history::{self, History, HistoryOptions, Range};
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use common::Db;
use shared::{finished, recorded, seed};

async fn histories(db: &Db, n: usize) -> Vec<History> {
    histories_with(db, n, HistoryOptions::default()).await
}

async fn histories_with(db: &Db, n: usize, options: HistoryOptions) -> Vec<History> {
    let mut out = Vec::new();
    for _ in 0..n {
        // A pool of its own each: three processes.
        let pool = db.db.pool(2).await.unwrap();
        let table = dbworker::JobTable::new(&pool, dbworker::JobTableOptions::detected("jobs"))
            .await
            .unwrap();
        out.push(History::new(&pool, &table, options.clone()).await.unwrap());
    }
    out
}

#[tokio::test]
async fn three_processes_record_every_finished_job_once() {
    let db = seed().await;
    let mut o = HistoryOptions::default();
    o.interval = Duration::from_millis(20);
    let hs = histories_with(&db, 3, o).await;
    // Every process's passes at once, several times over, and the runner too.
    let stop = CancellationToken::new();
    let running: Vec<_> = hs
        .iter()
        .cloned()
        .map(|h| {
            let stop = stop.clone();
            tokio::spawn(async move { h.run(stop).await.unwrap() })
        })
        .collect();
    for _ in 0..3 {
        let passes = join_all(hs.iter().map(History::record_once)).await;
        for p in passes {
            p.unwrap();
        }
    }
    stop.cancel();
    for r in running {
        r.await.unwrap();
    }
    for (state, queue) in [
        ("completed", Some("mail")),
        ("completed", Some("timing")),
        ("failed", Some("reports")),
        ("canceled", Some("reports")),
        ("completed", None),
    ] {
        assert_eq!(
            recorded(&db, state, queue).await,
            finished(&db, state, queue).await,
            "{state} in {queue:?}"
        );
    }
    // Retried: mail's completed jobs failed i % 3 times; reports' failed
    // jobs were retried twice each (their third attempt failed for good).
    let mail_retries: i64 = sqlx::query_scalar(
        "SELECT sum(num_failures)::bigint FROM jobs WHERE queue = 'mail' AND state = 'completed'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(recorded(&db, "retried", Some("mail")).await, mail_retries);
    assert_eq!(recorded(&db, "retried", Some("reports")).await, 40 * 2);
    // Canceled jobs that never started are counted, not timed.
    assert_eq!(recorded(&db, "timed", Some("reports")).await, 40);
    // One row per queue and minute, each a minute.
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT queue, seconds, count(*) FROM dbworker_history GROUP BY 1, 2 ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        rows.iter().all(|(_, seconds, _)| *seconds == 60),
        "{rows:?}"
    );
    assert_eq!(rows.iter().find(|r| r.0 == "timing").unwrap().2, 1);
    // A fourth pass finds nothing new.
    let again = hs[0].record_once().await.unwrap();
    assert_eq!(again.minutes, 0);
}

#[tokio::test]
async fn a_minute_keeps_its_wait_and_run_percentiles() {
    let db = seed().await;
    let h = &histories(&db, 1).await[0];
    h.record_once().await.unwrap();
    let (p50, p95, max, wp50, wmax): (f64, f64, f64, f64, f64) = sqlx::query_as(
        "SELECT run_p50, run_p95, run_max, wait_p50, wait_max FROM dbworker_history WHERE queue = 'timing'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // Runs of 1..=20 s, waits of 2..=40 s (continuous percentiles).
    assert!((p50 - 10.5).abs() < 1e-6, "{p50}");
    assert!((p95 - 19.05).abs() < 1e-6, "{p95}");
    assert!((max - 20.0).abs() < 1e-6, "{max}");
    assert!((wp50 - 21.0).abs() < 1e-6, "{wp50}");
    assert!((wmax - 40.0).abs() < 1e-6, "{wmax}");

    // Read back over each range: the totals are the table's.
    let pool = &db.pool;
    let day = history::series(pool, "dbworker_history", "jobs", Range::Day)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(day.total.completed, 620);
    assert_eq!(day.total.failed, 40);
    assert_eq!(day.total.canceled, 10);
    assert!(
        day.points.len() > 10 && day.points.len() <= 96,
        "{}",
        day.points.len()
    );
    assert!(day.points.windows(2).all(|w| w[0].at < w[1].at));
    assert!(day.points.iter().all(|p| p.at >= day.from));
    let hour = history::series(pool, "dbworker_history", "jobs", Range::Hour)
        .await
        .unwrap()
        .unwrap();
    let in_last_hour: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE state = 'completed' AND finished_at >= to_timestamp($1)",
    )
    .bind(hour.from as f64)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(hour.total.completed as i64, in_last_hour);
    let queues = history::by_queue(
        pool,
        "dbworker_history",
        "jobs",
        Duration::from_secs(86_400),
    )
    .await
    .unwrap()
    .unwrap();
    let timing = queues
        .iter()
        .find(|q| q.queue.as_deref() == Some("timing"))
        .unwrap();
    assert_eq!(timing.point.completed, 20);
    assert_eq!(timing.point.run_max, Some(20.0));
    // No history table: nothing to read, and no error.
    assert!(
        history::series(pool, "no_such_history", "jobs", Range::Hour)
            .await
            .unwrap()
            .is_none()
    );
}

/// Minute rows two days old, written as a pass would have: 120 minutes of
/// `mail` over two hours (minute i: i completed, 1 failed, timed i, run p50
/// i s, run max 2i s) and one minute of `reports`.
async fn old_minutes(db: &Db) {
    db.execute(
        "INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed, failed, timed, run_p50, run_p95, run_max, run_sum, wait_p50, wait_max, wait_sum)
           SELECT 'jobs', 'mail', h + i * interval '1 minute', 60, i, 1, i, i, i, 2 * i, i * i, 1, 1, i
           FROM generate_series(0, 119) AS i,
                LATERAL (SELECT to_timestamp(floor(EXTRACT(EPOCH FROM now() - interval '2 days') / 3600) * 3600) AS h) AS t;
         INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed, timed, run_max)
           VALUES ('jobs', 'reports', now() - interval '2 days', 60, 5, 5, 3);",
    )
    .await;
}

#[tokio::test]
async fn old_minutes_become_hours_with_the_same_sums() {
    let db = seed().await;
    old_minutes(&db).await;
    let before: (i64, i64, i64, f64) = sqlx::query_as(
        "SELECT sum(completed)::bigint, sum(failed)::bigint, sum(timed)::bigint, sum(run_sum) FROM dbworker_history WHERE bucket < now() - interval '1 day'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // Three processes downsample at once: each minute moves once.
    let hs = histories(&db, 3).await;
    for p in join_all(hs.iter().map(History::record_once)).await {
        p.unwrap();
    }
    let after: (i64, i64, i64, f64) = sqlx::query_as(
        "SELECT sum(completed)::bigint, sum(failed)::bigint, sum(timed)::bigint, sum(run_sum) FROM dbworker_history WHERE bucket < now() - interval '1 day'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(before, after);
    let old_minutes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dbworker_history WHERE seconds = 60 AND bucket < now() - interval '1 day 1 hour'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(old_minutes, 0);
    let hours: Vec<(i64, i64, f64, f64)> = sqlx::query_as(
        "SELECT completed, failed, run_max, run_p50 FROM dbworker_history WHERE queue = 'mail' AND seconds = 3600 ORDER BY bucket",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(hours.len(), 2, "{hours:?}");
    // Minutes 0..=59 then 60..=119: sums and maxima exact.
    assert_eq!(
        (hours[0].0, hours[0].1, hours[0].2),
        ((0..60).sum(), 60, 118.0)
    );
    assert_eq!(
        (hours[1].0, hours[1].1, hours[1].2),
        ((60..120).sum(), 60, 238.0)
    );
    // The median approximated: the minutes' weighted by their timed jobs
    // (sum of i² over sum of i for i in 0..=59).
    let want = (0..60).map(|i| f64::from(i * i)).sum::<f64>() / (0..60).map(f64::from).sum::<f64>();
    assert!((hours[0].3 - want).abs() < 1e-6, "{} vs {want}", hours[0].3);
    // Recent minutes stay minutes.
    assert_eq!(recorded(&db, "completed", Some("timing")).await, 20);
}

#[tokio::test]
async fn rows_older_than_keep_are_removed() {
    let db = seed().await;
    db.execute(
        "INSERT INTO dbworker_history (job_table, queue, bucket, seconds, completed)
           VALUES ('jobs', 'old', now() - interval '15 days', 3600, 7),
                  ('jobs', 'kept', now() - interval '13 days', 3600, 3),
                  ('other_jobs', 'old', now() - interval '15 days', 3600, 1);",
    )
    .await;
    let h = &histories(&db, 1).await[0];
    let r = h.record_once().await.unwrap();
    assert_eq!(r.removed, 1);
    assert_eq!(recorded(&db, "completed", Some("old")).await, 0);
    assert_eq!(recorded(&db, "completed", Some("kept")).await, 3);
    // Another job table's rows are its own history's to remove.
    let other: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dbworker_history WHERE job_table = 'other_jobs'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(other, 1);
}

/// Ends every other session of the database and waits until they are gone,
/// so their statistics are reported.
async fn settle(conn: &mut sqlx::PgConnection) {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if others == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{others} sessions left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Sequential scans of `jobs` as the statistics say, read on `conn` (whose
/// own pending statistics are flushed first).
async fn seq_scans(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pass_reads_the_job_table_through_the_index_only() {
    let db = seed().await;
    let h = &histories(&db, 1).await[0];
    // Every other connection may hold statistics not yet reported, which
    // would land late: each reading first ends them (a backend reports as it
    // exits) and waits until they are gone.
    let mut conn = db.pool.acquire().await.unwrap();
    settle(&mut conn).await;
    let before = seq_scans(&mut conn).await;
    let r = h.record_once().await.unwrap();
    assert!(r.minutes > 100, "{r:?}");
    settle(&mut conn).await;
    assert_eq!(
        seq_scans(&mut conn).await,
        before,
        "no sequential scan of jobs"
    );
    // The measure sees a scan: without the index (dropped after the check
    // of `History::new`), the same pass scans the table.
    db.execute("DROP INDEX jobs_finished_idx; DELETE FROM dbworker_history;")
        .await;
    h.record_once().await.unwrap();
    settle(&mut conn).await;
    assert!(seq_scans(&mut conn).await > before, "the scan is counted");
}

#[tokio::test]
async fn history_needs_its_table_and_an_index_over_finished_at() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let e = History::new(&db.pool, &table, HistoryOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dbworker_history does not exist") && e.contains("--history"),
        "{e}"
    );
    db.execute(&dbworker::ddl::history_table_sql("dbworker_history").unwrap())
        .await;
    let e = History::new(&db.pool, &table, HistoryOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--retention") && e.contains("finished_at"),
        "{e}"
    );
    db.add_columns(|c| c.retention = true, &[]).await;
    History::new(&db.pool, &table, HistoryOptions::default())
        .await
        .unwrap();
}

/// A job that ended while waiting (canceled during a retry's wait, a week
/// after its failed attempt started) records no run and no wait: a run is
/// measured within the attempt that ended the job.
#[tokio::test]
async fn a_job_that_ended_while_waiting_records_no_run_time() {
    let db = seed().await;
    db.execute(
        "INSERT INTO jobs (state, queue, queued_at, started_at, process_after, finished_at, num_failures)
         VALUES ('canceled', 'stale', now() - interval '7 days', now() - interval '7 days',
                 now() - interval '6 days', now() - interval '2 minutes', 1)",
    )
    .await;
    let h = &histories(&db, 1).await[0];
    h.record_once().await.unwrap();
    let (canceled, timed, run_max): (i64, i64, Option<f64>) = sqlx::query_as(
        "SELECT sum(canceled)::bigint, sum(timed)::bigint, max(run_max) FROM dbworker_history WHERE queue = 'stale'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((canceled, timed, run_max), (1, 0, None));
}

/// `retried` counts every failure that was followed by another attempt: all
/// of a canceled job's (each was retried before the cancel), all but the
/// final one of a failed job's.
#[tokio::test]
async fn a_canceled_job_counts_every_failure_as_retried() {
    let db = seed().await;
    db.execute(
        "INSERT INTO jobs (state, queue, finished_at, num_failures)
         VALUES ('canceled', 'retries', now() - interval '2 minutes', 2),
                ('failed', 'retries', now() - interval '2 minutes', 2),
                ('completed', 'retries', now() - interval '2 minutes', 2)",
    )
    .await;
    let h = &histories(&db, 1).await[0];
    h.record_once().await.unwrap();
    assert_eq!(recorded(&db, "retried", Some("retries")).await, 2 + 1 + 2);
}

/// A released workflow task waits from its release, not from its enqueue:
/// the time it was pending behind its upstream job is not queue wait. The
/// dependent here runs 2 s after an upstream that took an hour.
#[tokio::test]
async fn a_released_tasks_wait_starts_at_its_release() {
    let db = seed().await;
    db.execute(&dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    db.execute(
        "INSERT INTO jobs (id, state, queue, queued_at) VALUES
           (9001, 'queued', 'flow', now() - interval '1 hour'),
           (9002, 'queued', 'flow', now() - interval '1 hour');
         SELECT jobs_wait_for(9002, ARRAY[9001]::bigint[]);
         UPDATE jobs SET state = 'completed', started_at = queued_at, finished_at = clock_timestamp()
          WHERE id = 9001;
         UPDATE jobs SET state = 'completed', started_at = COALESCE(process_after, now()) + interval '2 seconds',
                finished_at = COALESCE(process_after, now()) + interval '3 seconds'
          WHERE id = 9002;
         -- Into closed minutes, every timestamp alike, so the history takes them.
         UPDATE jobs SET queued_at = queued_at - interval '2 hours', process_after = process_after - interval '2 hours',
                started_at = started_at - interval '2 hours', finished_at = finished_at - interval '2 hours'
          WHERE queue = 'flow';",
    )
    .await;
    let h = &histories(&db, 1).await[0];
    h.record_once().await.unwrap();
    let wait: f64 =
        sqlx::query_scalar("SELECT max(wait_max) FROM dbworker_history WHERE queue = 'flow'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        (wait - 2.0).abs() < 0.5,
        "the dependent waited 2 s, not {wait} s"
    );
}
