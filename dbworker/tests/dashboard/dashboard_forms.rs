//! The dashboard's pause and limit forms, through the router: a queue name
//! empty, blank or with whitespace at an end is refused with a 400 and
//! changes nothing (an empty one once paused the whole table), and pauses
//! and limits take names the same way; and what keeps an auto-refresh from
//! replacing a form being filled in (in a browser: browser.rs).

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::JobTableOptions;
use dbworker::control::{
    DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, Limit, Limits, Pauses, PausesOptions,
};
use router::{confirmation, csrf, get, post};

use crate::common::{self, Db};

/// The table's queue and kind columns, its pause and limit tables.
fn with_controls(t: &mut JobTableOptions) {
    t.queue_column = Some("queue".into());
    t.kind_column = Some("kind".into());
    t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
    t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
}

async fn rows(db: &Db, sql: &'static str) -> Vec<String> {
    sqlx::query_scalar(sql).fetch_all(&db.pool).await.unwrap()
}

#[tokio::test]
async fn blank_or_padded_queue_names_are_refused_by_pauses_and_limits_alike() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, with_controls).await;
    let (status, page) = get(&app, "/t/jobs/queues").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let token = csrf(&page);
    let pauses = "SELECT queue FROM dbworker_pauses ORDER BY queue";
    let limits = "SELECT queue FROM dbworker_limits ORDER BY queue";

    // Empty, blank, padded: 400 naming the queue field; nothing paused.
    for queue in ["", "%20%20", "%20mail", "mail%09"] {
        for what in ["pause", "resume"] {
            let form = format!("csrf={token}&queue={queue}&do={what}");
            let (status, body, _) = post(&app, "/t/jobs/queues/pause", &form, None).await;
            let blank = queue.is_empty() || queue == "%20%20";
            if what == "resume" && !blank {
                // Lifting takes the name exactly (a pause set before stays
                // liftable); there is none, so nothing changes.
                assert!(status.is_redirection(), "{form}: {status} {body}");
                continue;
            }
            assert_eq!(status, StatusCode::BAD_REQUEST, "{form}: {body}");
            assert!(body.starts_with("queue: "), "{form}: {body}");
        }
        let form = format!("csrf={token}&queue={queue}&max_processing=2");
        let (status, body, _) = post(&app, "/t/jobs/queues/limit", &form, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form}: {body}");
        assert!(body.starts_with("queue: "), "{form}: {body}");
        assert!(!body.contains("database error"), "{body}");
    }
    assert_eq!(rows(&db, pauses).await, Vec::<String>::new());
    assert_eq!(rows(&db, limits).await, Vec::<String>::new());

    // The whole table by its own button; an empty queue field never resumes it.
    assert!(page.contains(r#"name="scope" value="table""#), "{page}");
    let (status, _, _) = post(
        &app,
        "/t/jobs/queues/pause",
        &format!("csrf={token}&scope=table&do=pause"),
        None,
    )
    .await;
    assert!(status.is_redirection());
    assert_eq!(rows(&db, pauses).await, ["*"]);
    let (status, _, _) = post(
        &app,
        "/t/jobs/queues/pause",
        &format!("csrf={token}&queue=&do=resume"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(rows(&db, pauses).await, ["*"]);

    // A good name: paused and limited under the same name.
    for (path, form) in [
        ("/t/jobs/queues/pause", "queue=mail&do=pause"),
        ("/t/jobs/queues/limit", "queue=mail&max_processing=2"),
    ] {
        let (status, body, _) = post(&app, path, &format!("csrf={token}&{form}"), None).await;
        assert!(status.is_redirection(), "{form}: {status} {body}");
    }
    assert_eq!(rows(&db, pauses).await, ["*", "mail"]);
    assert_eq!(rows(&db, limits).await, ["mail"]);

    // The library refuses the same names.
    let t = db.table_with(with_controls).await;
    let p = Pauses::new(&db.pool, &t, PausesOptions::default())
        .await
        .unwrap();
    let l = Limits::new(&db.pool, &t).await.unwrap();
    for queue in ["", " ", " mail", "mail\n"] {
        assert!(p.pause(Some(queue), "test").await.is_err(), "{queue:?}");
        assert!(
            l.set_limit(queue, Limit::processing(1)).await.is_err(),
            "{queue:?}"
        );
    }
    assert_eq!(rows(&db, pauses).await, ["*", "mail"]);
    assert_eq!(rows(&db, limits).await, ["mail"]);
}

/// The pause form in a row of the queues page.
fn pause_form(row: &str) -> &str {
    let at = row.find("/queues/pause").expect("a pause form");
    let form = &row[row[..at].rfind("<form").unwrap()..];
    &form[..form.find("</form>").unwrap()]
}

/// On a table whose queue column allows NULL, jobs without a queue show as
/// the "(all)" row. Pausing that row pauses the whole table (a NULL queue is held by no
/// pause of a named queue): no store then claims them, and the row shows
/// paused. It offers no limit (no queue's limit holds them).
#[tokio::test]
async fn pausing_the_all_row_of_jobs_without_a_queue_pauses_the_whole_table() {
    let (db, _) = shared::seed().await;
    // An application's own queue column may allow NULL (the migration's does not).
    db.execute(
        "ALTER TABLE jobs ALTER COLUMN queue DROP NOT NULL;
         INSERT INTO jobs (state, kind, queue) VALUES ('queued', 'send', NULL), ('queued', 'send', NULL);",
    )
    .await;
    let app = router::dashboard(&db, with_controls).await;
    let (status, page) = get(&app, "/t/jobs/queues").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let row = &page[page.find("<td>(all)</td>").expect("an (all) row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("running"), "{row}");
    assert!(!row.contains("/queues/limit"), "no limit form: {row}");
    let form = confirmation(pause_form(row));
    assert!(form.contains("do=pause"), "{form}");
    assert!(
        !form.contains("queue="),
        "never a queue named \"(all)\": {form}"
    );

    let (status, body, _) = post(&app, "/t/jobs/queues/pause", &form, None).await;
    assert!(status.is_redirection(), "{status} {body}");
    assert_eq!(
        rows(&db, "SELECT queue FROM dbworker_pauses ORDER BY queue").await,
        ["*"],
        "the whole table"
    );
    let store = db
        .store_on(
            &db.table_with(with_controls).await,
            common::Db::options_for_tests(),
        )
        .await;
    use workerutil::Store as _;
    let claimed = store
        .dequeue("host", &dbworker::DbConditions::new(), 10)
        .await
        .unwrap();
    assert!(claimed.is_empty(), "{} claimed", claimed.len());
    let (_, page) = get(&app, "/t/jobs/queues").await;
    let row = &page[page.find("<td>(all)</td>").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("<strong>paused</strong>"), "{row}");
    assert!(row.contains(">Resume the table<"), "{row}");

    // Its Resume resumes the table: the jobs without a queue run again.
    let form = confirmation(pause_form(row));
    let (status, _, _) = post(&app, "/t/jobs/queues/pause", &form, None).await;
    assert!(status.is_redirection());
    assert_eq!(
        rows(&db, "SELECT queue FROM dbworker_pauses").await,
        Vec::<String>::new()
    );
}

/// `?refresh=N` was a bare refresh meta tag: the page reloaded over a form
/// the operator had started filling in, focused or not. With script the
/// reload is live.js's, which waits while a field is focused or edited (and
/// says so); the meta tag is left for pages without script.
#[tokio::test]
async fn a_refresh_waits_for_a_form_being_filled_in() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, with_controls).await;
    let (status, page) = get(&app, "/t/jobs/queues?refresh=5").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>"),
        "the meta tag only without script: {page}"
    );
    assert_eq!(page.matches("http-equiv").count(), 1, "{page}");
    assert!(page.contains("data-reload=\"5\""), "{page}");
    assert!(page.contains("<form"), "a page with forms: {page}");
    let waiting = "<span id=\"refresh-held\" hidden>";
    assert!(page.contains(waiting), "{page}");
    // The live page says it too; a paused one has nothing to wait for.
    let (_, page) = get(&app, "/t/jobs/queues").await;
    assert!(
        page.contains(waiting) && !page.contains("data-reload"),
        "{page}"
    );
    let (_, page) = get(&app, "/t/jobs/queues?paused=5").await;
    assert!(
        !page.contains(waiting) && !page.contains("data-reload"),
        "{page}"
    );
    // The script reloads only while no field is focused or changed from
    // the value it was served with.
    let (status, script) = get(&app, "/assets/live.js").await;
    assert_eq!(status, StatusCode::OK);
    for part in [
        "data-reload",
        "location.reload()",
        "field.value !== field.defaultValue",
        "defaultSelected",
        "document.activeElement",
        "refresh-held",
    ] {
        assert!(script.contains(part), "{part} in {script}");
    }
}
