//! The dashboard's cron page, against real Postgres through the router:
//! each schedule with its expression, time zone, last and next tick
//! (relative and absolute, UTC and local) and the job it last enqueued,
//! linked; an unknown zone in one row (written by a newer build) leaves the
//! others shown; names are escaped; the page and its nav link exist only
//! with a cron table.

use crate::common;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::NewJob;
use dbworker::cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::ddl::cron_table_sql;
use router::get;

use common::Db;

async fn set_up() -> Db {
    let db = Db::new().await;
    db.execute(&cron_table_sql(DEFAULT_CRON_TABLE).unwrap())
        .await;
    db
}

#[tokio::test]
async fn the_cron_page_shows_each_schedule_its_ticks_and_its_last_job() {
    let db = set_up().await;
    let table = db.table().await;
    let scheduler = Scheduler::new(&db.pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .add_in_zone(
            "berlin-nightly",
            "30 2 * * *",
            "Europe/Berlin",
            NewJob::new(),
            Backfill::RunOnce,
        )
        .unwrap()
        .add(
            "<b>hourly</b>",
            "0 * * * *",
            NewJob::new(),
            Backfill::RunOnce,
        )
        .unwrap();
    scheduler.tick().await.unwrap();
    // The nightly schedule's last tick was two nights ago: the next pass
    // enqueues it once (RunOnce) and records the job.
    db.execute(
        "UPDATE dbworker_cron SET last_tick = '2026-10-24 12:00:00+00' WHERE schedule = 'berlin-nightly'",
    )
    .await;
    let enqueued = scheduler.tick().await.unwrap();
    assert_eq!(enqueued.len(), 1);
    let job = enqueued[0].1;
    let last_tick: String = sqlx::query_scalar(
        "SELECT to_char(last_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') FROM dbworker_cron WHERE schedule = 'berlin-nightly'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // A row a newer build wrote, naming a zone this one does not know.
    db.execute(
        "INSERT INTO dbworker_cron (job_table, schedule, last_tick, expression, time_zone)
         VALUES ('jobs', 'from-the-future', now(), '0 3 * * *', 'Mars/Olympus')",
    )
    .await;

    let mut o = DashboardOptions::new(vec![table.clone()]);
    o.cron_table = Some(DEFAULT_CRON_TABLE.into());
    let dashboard = Dashboard::new(&db.pool, o).await.unwrap();
    let app = dashboard.router();
    let (status, page) = get(&app, "/t/jobs/cron").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // The nav links to it.
    assert!(page.contains(r#"href="/t/jobs/cron""#), "{page}");
    // Each schedule, by name, escaped.
    assert!(page.contains("berlin-nightly"), "{page}");
    assert!(page.contains("&lt;b&gt;hourly&lt;/b&gt;") && !page.contains("<b>hourly"));
    let row = |name: &str| {
        let start = page
            .find(&format!("<td>{name}</td>"))
            .unwrap_or_else(|| panic!("{name}: {page}"));
        let end = page[start..].find("</tr>").unwrap() + start;
        page[start..end].to_owned()
    };
    let berlin = row("berlin-nightly");
    assert!(
        berlin.contains("<code>30 2 * * *</code>") && berlin.contains("Europe/Berlin"),
        "{berlin}"
    );
    // Last tick: absolute in UTC and in Berlin, and relative.
    assert!(
        berlin.contains(&format!("{last_tick} UTC")),
        "{last_tick}: {berlin}"
    );
    assert!(berlin.contains(" ago</time>"), "{berlin}");
    assert!(
        berlin.contains(" CET") || berlin.contains(" CEST"),
        "{berlin}"
    );
    // The next tick: tomorrow's 02:30 in Berlin, ahead.
    assert!(berlin.contains(">in "), "{berlin}");
    assert!(
        berlin.contains(":30:00 CET") || berlin.contains(":30:00 CEST"),
        "{berlin}"
    );
    // Its last job, linked to the job page.
    assert!(
        berlin.contains(&format!(r#"<a href="/t/jobs/jobs/{job}">{job}</a>"#)),
        "{berlin}"
    );
    let (status, _) = get(&app, &format!("/t/jobs/jobs/{job}")).await;
    assert_eq!(status, StatusCode::OK);
    let hourly = row("&lt;b&gt;hourly&lt;/b&gt;");
    assert!(
        hourly.contains("<td>UTC</td>") && hourly.contains("none yet"),
        "{hourly}"
    );
    // The unknown zone is said; the row and the others are shown.
    let future = row("from-the-future");
    assert!(
        future.contains("unknown time zone &quot;Mars/Olympus&quot;"),
        "{future}"
    );

    // A schedule no scheduler has run for a day is flagged.
    db.execute("UPDATE dbworker_cron SET last_tick = now() - interval '1 day 2 hours' WHERE schedule = '<b>hourly</b>'")
        .await;
    let (_, page) = get(&app, "/t/jobs/cron").await;
    assert!(
        page.contains("overdue: is a scheduler running it?"),
        "{page}"
    );

    // Without a cron table: no page, no link.
    let plain = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (status, body) = get(&plain, "/t/jobs/cron").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("cron_table"), "{body}");
    let (_, overview) = get(&plain, "/").await;
    assert!(!overview.contains("/cron\""), "{overview}");
}

#[tokio::test]
async fn a_missing_cron_table_is_named_at_start_up() {
    let db = Db::new().await;
    let mut o = DashboardOptions::new(vec![db.table().await]);
    o.cron_table = Some("no_such_cron".into());
    let err = Dashboard::new(&db.pool, o).await.unwrap_err().to_string();
    assert!(
        err.contains("no_such_cron") && err.contains("migration --cron"),
        "{err}"
    );
}
