//! Cron schedules on real Postgres: four schedulers racing on one schedule
//! enqueue each tick exactly once, ticks missed during downtime follow the
//! backfill policy, and a running scheduler ticks until it is stopped.

use crate::TIMED;
use crate::common;

use dbworker::Service;
use std::time::{Duration, Instant};

use dbworker::{
    KeyMode, NewJob,
    cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions},
    ddl::cron_table_sql,
};
use serde_json::json;

use common::Db;

async fn set_up() -> Db {
    let db = Db::new().await;
    let ddl = cron_table_sql(DEFAULT_CRON_TABLE).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    db
}

/// A scheduler on a pool of its own (another process, as Postgres sees it).
async fn scheduler(db: &Db, name: &str, expression: &str, backfill: Backfill) -> Scheduler {
    let pool = db.db.pool(2).await.unwrap();
    Scheduler::new(&pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap()
        .add(
            name,
            expression,
            NewJob::new().json("payload", json!({ "cron": name })),
            backfill,
        )
        .unwrap()
}

/// The schedule's last tick, in whole seconds since the epoch.
async fn last_tick(db: &Db, name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT floor(EXTRACT(EPOCH FROM last_tick))::bigint FROM dbworker_cron WHERE schedule = $1",
    )
    .bind(name)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn jobs_of(db: &Db, name: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE payload->>'cron' = $1")
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn four_schedulers_enqueue_each_tick_exactly_once() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let mut schedulers = Vec::new();
    for _ in 0..4 {
        schedulers.push(scheduler(&db, "every-second", "* * * * * *", Backfill::default()).await);
    }
    // Registers the schedule: it starts from now.
    assert!(schedulers[0].tick().await.unwrap().is_empty());
    let first = last_tick(&db, "every-second").await;
    let until = Instant::now() + Duration::from_millis(3200);
    let mut tasks = Vec::new();
    for s in schedulers {
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                s.tick().await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let last = last_tick(&db, "every-second").await;
    let ticks = last - first;
    assert!(ticks >= 2, "ticks passed: {ticks}");
    assert_eq!(
        jobs_of(&db, "every-second").await,
        ticks,
        "one job per tick"
    );
}

/// `run` ticks every interval (1 s by default) until its token fires.
#[tokio::test]
async fn run_enqueues_each_tick_until_stopped() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let s = scheduler(&db, "run", "* * * * * *", Backfill::default()).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { s.run(stop).await.unwrap() }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while jobs_of(&db, "run").await < 2 {
        assert!(
            Instant::now() < deadline,
            "the running scheduler enqueued no tick"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), run)
        .await
        .expect("a stop ends the wait between passes")
        .unwrap();
}

#[tokio::test]
async fn missed_ticks_run_once_or_are_skipped() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    // Every 1 January at midnight; the last tick recorded three years ago.
    let yearly = "0 0 1 1 *";
    let catch_up = scheduler(&db, "catch-up", yearly, Backfill::RunOnce).await;
    let skip = scheduler(
        &db,
        "skip",
        yearly,
        Backfill::Skip {
            grace: Duration::from_secs(60),
        },
    )
    .await;
    assert!(catch_up.tick().await.unwrap().is_empty());
    assert!(skip.tick().await.unwrap().is_empty());
    sqlx::query("UPDATE dbworker_cron SET last_tick = now() - interval '3 years'")
        .execute(&db.pool)
        .await
        .unwrap();

    let ran = catch_up.tick().await.unwrap();
    assert_eq!(ran.len(), 1, "one job for three missed ticks");
    assert!(skip.tick().await.unwrap().is_empty());
    assert_eq!(jobs_of(&db, "catch-up").await, 1);
    assert_eq!(jobs_of(&db, "skip").await, 0);
    // Both moved past the missed ticks: nothing more until next year.
    assert!(catch_up.tick().await.unwrap().is_empty());
    assert!(skip.tick().await.unwrap().is_empty());
    assert_eq!(jobs_of(&db, "catch-up").await, 1);
}

/// An edited schedule starts from the edit: its new expression's ticks
/// before it are not caught up on, even with a fill window that covers them.
#[tokio::test]
async fn an_edited_schedule_starts_from_the_edit() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let day = Backfill::Fill {
        window: Duration::from_secs(2 * 24 * 3600),
    };
    let daily = scheduler(&db, "report", "0 3 * * *", day).await;
    assert!(daily.tick().await.unwrap().is_empty());
    sqlx::query("UPDATE dbworker_cron SET last_tick = now() - interval '1 day'")
        .execute(&db.pool)
        .await
        .unwrap();
    let every_five = scheduler(&db, "report", "*/5 * * * *", day).await;
    every_five.tick().await.unwrap();
    // Without the restart: a job for each five minutes of the last day (288).
    assert_eq!(jobs_of(&db, "report").await, 0);
    let since_edit: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM clock_timestamp() - last_tick)::float8 FROM dbworker_cron WHERE schedule = 'report'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(since_edit < 5.0, "last tick {since_edit} s ago");
}

/// A schedule whose row another scheduler holds (paused mid-tick) costs a
/// pass two seconds at most, and the other schedules still tick.
#[tokio::test]
async fn a_schedule_held_by_a_stuck_scheduler_stops_no_other() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let pool = db.db.pool(2).await.unwrap();
    let both = Scheduler::new(&pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap()
        .add(
            "held",
            "* * * * * *",
            NewJob::new().json("payload", json!({"cron": "held"})),
            Backfill::default(),
        )
        .unwrap()
        .add(
            "free",
            "* * * * * *",
            NewJob::new().json("payload", json!({"cron": "free"})),
            Backfill::default(),
        )
        .unwrap();
    both.tick().await.unwrap();
    let mut stuck = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM dbworker_cron WHERE schedule = 'held' FOR UPDATE")
        .execute(&mut *stuck)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    let ran = tokio::time::timeout(Duration::from_secs(10), both.tick())
        .await
        .expect("the pass waits for the held row at most its lock timeout")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!ran.is_empty(), "the free schedule ticked");
    assert!(ran.iter().all(|(name, _)| name == "free"), "{ran:?}");
    stuck.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    both.tick().await.unwrap();
    assert!(jobs_of(&db, "held").await >= 1, "released, it ticks again");
}

/// A keyed schedule whose previous job is held by a transaction (a
/// transactional handler that wrote its progress locks the row until it
/// ends) waits for it at most the tick's lock timeout: the other schedules
/// still tick on time, and the held tick lands, once, at a pass after the
/// lock is released.
#[tokio::test]
async fn a_keyed_schedule_whose_holder_is_locked_stops_no_other() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    db.add_columns(|c| c.keys = true, &[]).await;
    let table = db
        .table_with(|t| t.key_column = Some("job_key".into()))
        .await;
    let pool = db.db.pool(2).await.unwrap();
    let both = Scheduler::new(&pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .add(
            "keyed",
            "* * * * * *",
            NewJob::new()
                .json("payload", json!({"cron": "keyed"}))
                .key("keyed", KeyMode::Replace),
            Backfill::default(),
        )
        .unwrap()
        .add(
            "free",
            "* * * * * *",
            NewJob::new().json("payload", json!({"cron": "free"})),
            Backfill::default(),
        )
        .unwrap();
    both.tick().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    both.tick().await.unwrap();
    let holder: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE job_key = 'keyed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Its handler runs, and has written its progress in its transaction.
    db.execute(&format!(
        "UPDATE jobs SET state = 'processing', started_at = now() WHERE id = {holder}"
    ))
    .await;
    let mut handler = db.pool.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET payload = payload WHERE id = $1")
        .bind(holder)
        .execute(&mut *handler)
        .await
        .unwrap();
    let last = last_tick(&db, "keyed").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    let ran = tokio::time::timeout(Duration::from_secs(10), both.tick())
        .await
        .expect("the pass waits for the held job at most its lock timeout")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(ran.iter().any(|(name, _)| name == "free"), "{ran:?}");
    assert!(ran.iter().all(|(name, _)| name == "free"), "{ran:?}");
    assert_eq!(last_tick(&db, "keyed").await, last, "the held tick is kept");
    handler.commit().await.unwrap();
    let ran = both.tick().await.unwrap();
    let keyed: Vec<_> = ran.iter().filter(|(name, _)| name == "keyed").collect();
    assert_eq!(keyed.len(), 1, "the held tick lands once: {ran:?}");
    assert!(last_tick(&db, "keyed").await > last);
}

#[tokio::test]
async fn bad_expressions_and_a_missing_cron_table_are_named() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    let err = Scheduler::new(&db.pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("dbworker_cron"), "{err}");
    let db = set_up().await;
    let s = Scheduler::new(&db.pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap();
    let err = s
        .add("bad", "every day", NewJob::new(), Backfill::RunOnce)
        .unwrap_err();
    assert!(err.to_string().contains("expression"), "{err}");
}
