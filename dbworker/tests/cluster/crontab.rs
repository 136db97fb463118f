//! Crontab files on real Postgres: `fill` backfills exactly the ticks missed
//! within its window, once, with two schedulers started at once, and each
//! job's payload carries the entry's JSON and `_cron`.

use crate::TIMED;
use crate::common;

use dbworker::{
    JobTable, JobTableOptions,
    cron::{Crontab, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions},
    ddl::cron_table_sql,
};

use common::Db;

const CRONTAB: &str = r#"
# Hourly roll-ups; after downtime, the ticks of the last three hours.
0 * * * * rollup ?id=hourly_rollup&fill=3h&queue=reports&priority=3&max=4 {"region": "eu"}
"#;

async fn set_up() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.kind = true;
            c.queue = true;
            c.priority = true;
            c.max_retries = true;
        },
        &[cron_table_sql(DEFAULT_CRON_TABLE).unwrap()],
    )
    .await;
    db
}

/// The test table with every column the crontab's entry sets.
fn options() -> JobTableOptions {
    let mut t = Db::table_options();
    t.kind_column = Some("kind".into());
    t.queue_column = Some("queue".into());
    t.priority_column = Some("priority".into());
    t.max_retries_column = Some("max_retries".into());
    t.payload_column = Some("payload".into());
    t
}

/// A scheduler on a pool of its own (another process, as Postgres sees it).
async fn scheduler(db: &Db) -> Scheduler {
    let pool = db.db.pool(2).await.unwrap();
    let table = JobTable::new(&pool, options()).await.unwrap();
    Scheduler::new(&pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&Crontab::parse(CRONTAB).unwrap())
        .unwrap()
}

async fn count(db: &Db, sql: &'static str) -> i64 {
    db.scalar(sql, 0).await
}

#[tokio::test]
async fn fill_backfills_the_missed_ticks_once_across_two_schedulers() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    // Known from now on (fill never backfills a schedule it has not seen).
    assert!(scheduler(&db).await.tick().await.unwrap().is_empty());
    // Five and a half hours of downtime: five missed hourly ticks, three of
    // them within the three-hour window.
    db.execute("UPDATE dbworker_cron SET last_tick = now() - interval '5 hours 30 minutes'")
        .await;

    // Two processes start at once.
    let (a, b) = (scheduler(&db).await, scheduler(&db).await);
    let (a, b) = tokio::join!(
        tokio::spawn(async move { a.tick().await.unwrap() }),
        tokio::spawn(async move { b.tick().await.unwrap() })
    );
    let mut ids: Vec<i64> = a
        .unwrap()
        .into_iter()
        .chain(b.unwrap())
        .map(|(_, id)| id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        3,
        "one job per missed tick in the window: {ids:?}"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM jobs WHERE $1 = $1").await,
        3
    );

    // Each payload: the entry's JSON and `_cron`, at distinct hours within
    // the window; the entry's options on the row.
    let on_the_hour_in_window = count(
        &db,
        "SELECT count(DISTINCT payload->'_cron'->>'ts') FROM jobs
          WHERE (payload->'_cron'->>'ts')::timestamptz = date_trunc('hour', (payload->'_cron'->>'ts')::timestamptz)
            AND (payload->'_cron'->>'ts')::timestamptz > now() - interval '3 hours'
            AND (payload->'_cron'->>'ts')::timestamptz <= now()
            AND payload->'_cron'->>'ts' LIKE '%:00:00Z'
            AND payload->>'region' = 'eu' AND $1 = $1",
    )
    .await;
    assert_eq!(on_the_hour_in_window, 3);
    let rows = count(
        &db,
        "SELECT count(*) FROM jobs WHERE kind = 'rollup' AND queue = 'reports'
            AND priority = 3 AND max_retries = 3 AND $1 = $1",
    )
    .await;
    assert_eq!(rows, 3);
    // Missed ticks are backfilled; the latest too unless it is on time.
    let wrong = count(
        &db,
        "SELECT count(*) FROM jobs j WHERE (j.payload->'_cron'->>'backfilled')::boolean <> (
             (j.payload->'_cron'->>'ts')::timestamptz < (SELECT max((payload->'_cron'->>'ts')::timestamptz) FROM jobs)
             OR now() - (j.payload->'_cron'->>'ts')::timestamptz > interval '61 seconds') AND $1 = $1",
    )
    .await;
    assert_eq!(wrong, 0, "backfilled flags");

    // Nothing more until the next hour, whoever looks.
    for s in [scheduler(&db).await, scheduler(&db).await] {
        assert!(s.tick().await.unwrap().is_empty());
    }
    assert_eq!(
        count(&db, "SELECT count(*) FROM jobs WHERE $1 = $1").await,
        3
    );
}

#[tokio::test]
async fn a_crontab_needs_its_columns_and_says_which_line() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let crontab = Crontab::parse(CRONTAB).unwrap();
    let err = Scheduler::new(&db.pool, &db.table().await, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&crontab)
        .unwrap_err();
    assert!(err.to_string().contains("payload_column"), "{err}");
    let payload_only = db
        .table_with(|t| t.payload_column = Some("payload".into()))
        .await;
    let err = Scheduler::new(&db.pool, &payload_only, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&crontab)
        .unwrap_err();
    assert!(
        err.to_string().starts_with("crontab line 3: ") && err.to_string().contains("is not set"),
        "{err}"
    );
    // The table's check names the missing payload column.
    let mut options = self::options();
    options.payload_column = Some("no_such_column".into());
    let err = JobTable::new(&db.pool, options).await.unwrap_err();
    assert!(
        err.to_string().contains("no_such_column (payload_column)"),
        "{err}"
    );
}
