//! The overview's charts, read from the job history: for each range (1 h,
//! 24 h, 7 d, chosen by a link) the SVG has its time axis in UTC, its value
//! axis, its labels and the range's totals; no inline script; without the history
//! table the overview says how to create it.

use crate::common;
use crate::fixtures::history as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::history::{History, HistoryOptions};

use common::Db;
use router::get;

async fn app(db: &Db) -> axum::Router {
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let dashboard = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap();
    dashboard.router()
}

/// The text of every `<text>` element of the page's SVG charts.
fn svg_texts(page: &str) -> Vec<String> {
    page.split("<text")
        .skip(1)
        .filter_map(|t| {
            let start = t.find('>')? + 1;
            let end = t.find("</text>")?;
            Some(t[start..end].to_owned())
        })
        .collect()
}

/// `HH:MM` of the database clock, `minutes` ago rounded down to `every` minutes.
async fn clock_label(db: &Db, every_minutes: i64) -> String {
    sqlx::query_scalar(
        "SELECT to_char(to_timestamp(floor(EXTRACT(EPOCH FROM now()) / ($1 * 60)) * $1 * 60) AT TIME ZONE 'UTC', 'HH24:MI')",
    )
    .bind(every_minutes)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_overview_charts_the_history_for_each_range() {
    let db = shared::seed().await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    History::new(&db.pool, &table, HistoryOptions::default())
        .await
        .unwrap()
        .record_once()
        .await
        .unwrap();
    let app = app(&db).await;

    // The default range is the last hour, a bar per minute.
    let (status, page) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page.matches("<script").count(), 1, "only live.js: {page}");
    assert!(page.contains("Finished jobs per minute"), "{page}");
    assert!(page.contains("Wait and run time (p50, p95)"), "{page}");
    let texts = svg_texts(&page);
    assert!(texts.iter().any(|t| t == "time (UTC)"), "{texts:?}");
    // The time axis is labelled every 10 minutes, the current one included.
    let now_tick = clock_label(&db, 10).await;
    assert!(texts.contains(&now_tick), "{now_tick} in {texts:?}");
    assert!(
        texts
            .iter()
            .filter(|t| t.len() == 5 && t.as_bytes()[2] == b':')
            .count()
            >= 5,
        "{texts:?}"
    );
    // The value axis starts at 0.
    assert!(texts.iter().any(|t| t == "0"), "{texts:?}");
    // The hour's totals are the table's.
    let in_hour: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE state = 'completed' AND finished_at >= to_timestamp(floor(EXTRACT(EPOCH FROM now()) / 60) * 60 - 59 * 60)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let totals = texts
        .iter()
        .find(|t| t.starts_with("total over 1h"))
        .unwrap();
    assert!(
        totals.contains(&format!("completed {in_hour} ")),
        "{totals} vs {in_hour}"
    );
    // Links to the other ranges, the current one not a link.
    assert!(page.contains(r#"<strong>1h</strong>"#), "{page}");
    assert!(page.contains(r#"href="?range=24h""#) && page.contains(r#"href="?range=7d""#));

    // 24 h: every job of the seed, 15-minute bars, 4-hourly labels.
    let (status, page) = get(&app, "/?range=24h").await;
    assert_eq!(status, StatusCode::OK);
    let texts = svg_texts(&page);
    assert!(page.contains("Finished jobs per 15 minutes"), "{page}");
    let totals = texts
        .iter()
        .find(|t| t.starts_with("total over 24h"))
        .unwrap();
    assert!(
        totals.contains("completed 620 · failed 40 · canceled 10 · retried "),
        "{totals}"
    );
    let times = texts
        .iter()
        .find(|t| t.starts_with("over 24h: wait p50"))
        .unwrap();
    assert!(
        times.contains("run") && times.contains("max 20.0 s"),
        "{times}"
    );
    assert!(texts.contains(&clock_label(&db, 240).await), "{texts:?}");
    // Each bar says what it holds.
    assert!(
        page.contains("<title>") && page.contains(" UTC: "),
        "{page}"
    );

    // 7 d: 3-hour bars, a label per day ("Thu 26 Nov").
    let (status, page) = get(&app, "/?range=7d").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Finished jobs per 3 hours"), "{page}");
    let texts = svg_texts(&page);
    let today: String = sqlx::query_scalar("SELECT to_char(now() AT TIME ZONE 'UTC', 'Dy DD Mon')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(texts.contains(&today), "{today} in {texts:?}");
    // A bar's hover text names its day as well as its hour ("Thu 26 Nov
    // 21:00 UTC: …"): the hour alone named one of seven.
    let titles: Vec<&str> = page
        .split("<title>")
        .skip(2)
        .filter_map(|t| t.split("</title>").next())
        .collect();
    let today_bar = |t: &str| {
        t.strip_prefix(&format!("{today} ")).is_some_and(|rest| {
            let hour = rest.get(..5).unwrap_or("");
            hour.as_bytes().get(2) == Some(&b':')
                && hour.replace(':', "").chars().all(|c| c.is_ascii_digit())
                && rest[5..].starts_with(" UTC: ")
        })
    };
    assert!(
        titles.iter().any(|t| today_bar(t)),
        "no bar of {today} with its hour: {titles:?}"
    );
    assert!(
        titles.iter().all(|t| !t.starts_with(char::is_numeric)),
        "a bar without its day: {titles:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("total over 7d: completed 620")),
        "{texts:?}"
    );

    // A range that is not offered is refused, naming the parameter.
    let (status, body) = get(&app, "/?range=2h").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("range:"), "{body}");
    // The refresh links keep the range.
    let (_, page) = get(&app, "/?range=24h&refresh=5").await;
    assert!(page.contains(r#"href="?range=7d&amp;refresh=5""#), "{page}");
}

#[tokio::test]
async fn without_the_history_table_the_overview_says_how_to_create_it() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let app = app(&db).await;
    let (status, page) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<svg class=\"history\""), "{page}");
    assert!(
        page.contains("dbworker migration --table jobs --history"),
        "{page}"
    );
    assert!(page.contains("dbworker_history"), "{page}");
}

/// A history that cannot be read (here a table of that name with the
/// columns the status reads, not the charts' measures) is said to be
/// unreadable; the database's text, which names tables, columns and roles,
/// stays in the log.
#[tokio::test]
async fn an_unreadable_history_shows_no_database_text() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "CREATE TABLE dbworker_history (job_table text, queue text, bucket timestamptz,
         completed bigint, failed bigint, canceled bigint)",
    )
    .await;
    let app = app(&db).await;
    let (status, page) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("The history could not be read"), "{page}");
    assert!(!page.contains("does not exist"), "{page}");
    assert!(!page.contains("error returned from database"), "{page}");
}
