//! Cron schedules that fail on real Postgres: one schedule whose enqueue
//! fails is reported by name (and crontab line) while the others still
//! enqueue; schedules that can never be enqueued (a payload holding NUL) or
//! never fire (February 30) are refused up front, naming the line.

use crate::TIMED;
use crate::common;
use crate::fixtures::cron as cron_table;

use dbworker::{
    NewJob,
    cron::{Backfill, Crontab, Scheduler, SchedulerOptions},
};
use serde_json::json;

use common::Db;
use cron_table::{set_up, table};

/// Every schedule's next tick is due: its last one a minute ago.
async fn make_due(db: &Db) {
    db.execute("UPDATE dbworker_cron SET last_tick = now() - interval '1 minute'")
        .await;
}

#[tokio::test]
async fn a_failing_schedule_is_named_and_the_others_still_enqueue() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    // The first fails at every tick: its job sets a column the table lacks.
    let crontab = Crontab::parse("# the rollup\n* * * * * rollup ?fill=1h {\"n\": 1}\n").unwrap();
    let scheduler = Scheduler::new(&db.pool, &table(&db).await, SchedulerOptions::default())
        .await
        .unwrap()
        .add(
            "broken",
            "* * * * *",
            NewJob::new().set("no_such_column", 1),
            Backfill::RunOnce,
        )
        .unwrap()
        .crontab(&crontab)
        .unwrap()
        .add(
            "fine",
            "* * * * *",
            NewJob::new().kind("fine"),
            Backfill::RunOnce,
        )
        .unwrap();
    // The first pass registers each schedule (from now); the second runs them.
    scheduler.tick().await.unwrap();
    make_due(&db).await;
    let text = scheduler.tick().await.unwrap_err().to_string();
    assert!(
        text.starts_with("cron schedule \"broken\": ") && text.contains("no_such_column"),
        "{text}"
    );
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM jobs ORDER BY kind")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(kinds, ["fine", "rollup"], "the schedules after it ran");

    // A failing crontab entry names its line.
    let crontab = Crontab::parse("\n* * * * * report ?queue=reports&fill=1h\n").unwrap();
    // The table has no queue column, but the options say it has (it had
    // one while they were checked).
    db.execute("ALTER TABLE jobs ADD COLUMN queue text").await;
    let with_queue = db
        .table_with(|t| {
            t.kind_column = Some("kind".into());
            t.payload_column = Some("payload".into());
            t.queue_column = Some("queue".into());
        })
        .await;
    let scheduler = Scheduler::new(&db.pool, &with_queue, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&crontab)
        .unwrap();
    db.execute("ALTER TABLE jobs DROP COLUMN queue").await;
    scheduler.tick().await.unwrap();
    make_due(&db).await;
    let err = scheduler.tick().await.unwrap_err().to_string();
    assert!(
        err.starts_with("cron schedule \"report\" (crontab line 2): "),
        "{err}"
    );
}

#[tokio::test]
async fn schedules_that_cannot_enqueue_or_never_fire_are_refused_up_front() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    for (text, why) in [
        (
            "# header\n0 3 * * * report {\"s\": \"a\\u0000b\"}\n",
            "crontab line 2: the payload holds a NUL character (\\u0000) at $.s",
        ),
        (
            "\n\n0 0 30 2 * leap",
            "crontab line 3: \"0 0 30 2 *\" never fires",
        ),
    ] {
        let err = Crontab::parse(text).unwrap_err().to_string();
        assert!(err.starts_with(why), "{err}");
    }
    let scheduler = Scheduler::new(&db.pool, &table(&db).await, SchedulerOptions::default())
        .await
        .unwrap();
    let err = scheduler
        .clone()
        .add("leap", "0 0 31 4 *", NewJob::new(), Backfill::RunOnce)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`expression`") && err.contains("never fires"),
        "{err}"
    );
    let err = scheduler
        .clone()
        .add("a\0b", "0 3 * * *", NewJob::new(), Backfill::RunOnce)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`name`") && err.contains("NUL"), "{err}");
    let err = scheduler
        .add(
            "nul",
            "0 3 * * *",
            NewJob::new().json("payload", json!({ "s": "a\u{0}b" })),
            Backfill::RunOnce,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("(at $.s) holds a NUL"), "{err}");
}

/// A crontab line naming a zone this build does not know fails that
/// schedule's every pass, naming the schedule, its line and the zone; the
/// other lines enqueue. In code, `add` refuses it up front.
#[tokio::test]
async fn an_unknown_time_zone_fails_its_schedule_alone() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let crontab = Crontab::parse(
        "# two reports\nCRON_TZ=Europe/Berln * * * * * berlin\nCRON_TZ=Europe/Berlin * * * * * fine\n",
    )
    .unwrap();
    let scheduler = Scheduler::new(&db.pool, &table(&db).await, SchedulerOptions::default())
        .await
        .unwrap()
        .crontab(&crontab)
        .unwrap();
    for _ in 0..2 {
        let err = scheduler.tick().await.unwrap_err().to_string();
        assert!(
            err.starts_with("cron schedule \"berlin\" (crontab line 2): ")
                && err.contains("unknown time zone \"Europe/Berln\""),
            "{err}"
        );
        make_due(&db).await;
    }
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(kinds, ["fine"], "the other line ran");
    let schedules: Vec<String> = sqlx::query_scalar("SELECT schedule FROM dbworker_cron")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(schedules, ["fine"]);

    let err = Scheduler::new(&db.pool, &table(&db).await, SchedulerOptions::default())
        .await
        .unwrap()
        .add(
            "nightly",
            "CRON_TZ=Mars/Olympus 0 3 * * *",
            NewJob::new(),
            Backfill::RunOnce,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cron schedule \"nightly\": ") && err.contains("\"Mars/Olympus\""),
        "{err}"
    );
}
