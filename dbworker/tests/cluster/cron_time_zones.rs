//! Cron schedules in a named time zone on real Postgres: a schedule in
//! `Europe/Berlin` enqueues one job per local tick across both
//! daylight-saving changes (checked against Postgres's own time-zone
//! database), the cron table records each schedule's expression, zone and
//! last job, and a cron table made before those columns is named with the
//! statement that upgrades it.

use crate::TIMED;
use crate::common;
use crate::fixtures::cron as cron_table;

use dbworker::{
    NewJob,
    cron::{Backfill, Crontab, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions},
    ddl::cron_table_sql,
};

use common::Db;
use cron_table::{set_up, table};

/// The ticks' local times, as Postgres reads them in Europe/Berlin.
const LOCAL: &str = "(payload->'_cron'->>'ts')::timestamptz AT TIME ZONE 'Europe/Berlin'";

/// Injected times: the schedule's last tick is put back before Berlin's
/// fall-back change of 26 October 2025, and one pass fills every nightly
/// tick since (through the spring-forward change of 29 March 2026 and the
/// fall-back of 25 October 2026): one job per local night, at 02:30 local
/// time, or 03:00 on the night 02:30 does not exist.
#[tokio::test]
async fn a_berlin_schedule_enqueues_once_per_local_tick_across_both_changes() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let since = "2025-10-24 12:00:00+00";
    let days: i64 = sqlx::query_scalar(
        "SELECT ceil(EXTRACT(EPOCH FROM now() - $1::timestamptz) / 86400)::bigint + 1",
    )
    .bind(since)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let crontab = Crontab::parse(&format!(
        "CRON_TZ=Europe/Berlin 30 2 * * * nightly ?fill={days}d\n"
    ))
    .unwrap();
    let scheduler = Scheduler::new(&db.pool, &table(&db).await, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&crontab)
        .unwrap();
    assert!(scheduler.tick().await.unwrap().is_empty(), "registers");
    sqlx::query("UPDATE dbworker_cron SET last_tick = $1::timestamptz")
        .bind(since)
        .execute(&db.pool)
        .await
        .unwrap();
    let enqueued = scheduler.tick().await.unwrap();
    assert!(
        enqueued.len() >= 365,
        "a year of nights: {}",
        enqueued.len()
    );

    let q = |sql: String| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    // One job per local night, every night from the first to the last.
    let jobs = q("SELECT count(*) FROM jobs".into()).await;
    assert_eq!(jobs, enqueued.len() as i64);
    assert_eq!(
        q(format!("SELECT count(DISTINCT ({LOCAL})::date) FROM jobs")).await,
        jobs
    );
    assert_eq!(
        q(format!(
            "SELECT (max(({LOCAL})::date) - min(({LOCAL})::date) + 1)::bigint FROM jobs"
        ))
        .await,
        jobs,
        "no night skipped"
    );
    // 02:30 local time, but 03:00 on 29 March 2026 (02:30 does not exist).
    let off = q(format!(
        "SELECT count(*) FROM jobs WHERE ({LOCAL})::time <> CASE WHEN ({LOCAL})::date = '2026-03-29' THEN time '03:00' ELSE time '02:30' END"
    ))
    .await;
    assert_eq!(off, 0, "every tick at its local time");
    assert_eq!(
        q(format!("SELECT count(*) FROM jobs WHERE ({LOCAL})::date = '2026-03-29' AND payload->'_cron'->>'ts' = '2026-03-29T01:00:00Z'")).await,
        1
    );
    // On the nights 02:30 comes twice, the first (summer time) only.
    for (night, first) in [
        ("2025-10-26", "2025-10-26T00:30:00Z"),
        ("2026-10-25", "2026-10-25T00:30:00Z"),
    ] {
        let at: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT string_agg(payload->'_cron'->>'ts', ',') FROM jobs WHERE ({LOCAL})::date = '{night}'"
        )))
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(at, first, "{night}");
    }

    // The cron table: what the dashboard shows.
    let (expression, zone, last_job): (String, String, i64) = sqlx::query_as(
        "SELECT expression, time_zone, last_job_id FROM dbworker_cron WHERE schedule = 'nightly'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (expression.as_str(), zone.as_str()),
        ("30 2 * * *", "Europe/Berlin")
    );
    assert_eq!(
        last_job,
        enqueued.last().unwrap().1,
        "the last job enqueued"
    );
    // A pass that enqueues nothing keeps it.
    assert!(scheduler.tick().await.unwrap().is_empty());
    let kept: i64 = sqlx::query_scalar("SELECT last_job_id FROM dbworker_cron")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(kept, last_job);
}

/// A schedule whose expression or zone changes has its row updated.
#[tokio::test]
async fn a_changed_expression_or_zone_is_recorded() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let table = table(&db).await;
    let row = || async {
        sqlx::query_as::<_, (String, String)>("SELECT expression, time_zone FROM dbworker_cron")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let job = || NewJob::new().kind("report");
    Scheduler::new(&db.pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .add("report", "0 3 * * *", job(), Backfill::RunOnce)
        .unwrap()
        .tick()
        .await
        .unwrap();
    assert_eq!(row().await, ("0 3 * * *".into(), "UTC".into()));
    Scheduler::new(&db.pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .add_in_zone(
            "report",
            "0 4 * * *",
            "America/New_York",
            job(),
            Backfill::RunOnce,
        )
        .unwrap()
        .tick()
        .await
        .unwrap();
    assert_eq!(row().await, ("0 4 * * *".into(), "America/New_York".into()));
}

/// A cron table made by an earlier version lacks the dashboard's columns:
/// named, with the statement that adds them (the generated DDL, rerun).
#[tokio::test]
async fn a_cron_table_without_the_new_columns_is_named_and_upgraded_by_the_ddl() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    db.execute(
        r#"CREATE TABLE dbworker_cron (job_table text NOT NULL, schedule text NOT NULL,
             last_tick timestamptz NOT NULL, PRIMARY KEY (job_table, schedule))"#,
    )
    .await;
    let err = Scheduler::new(&db.pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has no column time_zone") && err.contains("ALTER TABLE"),
        "{err}"
    );
    db.execute(&cron_table_sql(DEFAULT_CRON_TABLE).unwrap())
        .await;
    Scheduler::new(&db.pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap();
}
