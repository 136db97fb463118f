//! Bulk actions on every job matching a filter, through the router: the
//! action touches only the jobs its confirmation counted, never one enqueued
//! while the operator read it, and a state it never touches is refused.

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE};
use router::{confirmation, csrf, get, post};

use crate::common::Db;

async fn count(db: &Db, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

async fn enqueue_mail(db: &Db, queue: &str, n: i32) {
    sqlx::query("INSERT INTO jobs (state, queue, kind) SELECT 'queued', $1, 'send' FROM generate_series(1, $2)")
        .bind(queue)
        .bind(n)
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_matching_action_touches_only_the_jobs_its_confirmation_counted() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, |t| {
        t.queue_column = Some("queue".into());
        t.kind_column = Some("kind".into());
        t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    })
    .await;
    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = csrf(&page);

    // Confirm: 30 queued mail jobs; then 5 more arrive before the click.
    let form = format!("csrf={token}&action=fail&scope=matching&f_queue=mail");
    let (status, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("fail 30 job(s)"), "{page}");
    let confirmed = confirmation(&page);
    assert!(confirmed.contains("max_id="), "{confirmed}");
    enqueue_mail(&db, "mail", 5).await;

    let (status, body, location) = post(&app, "/t/jobs/bulk", &confirmed, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains("done=fail+30"));
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM jobs WHERE queue = 'mail' AND state = 'failed'"
        )
        .await,
        30
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM jobs WHERE queue = 'mail' AND state = 'queued'"
        )
        .await,
        5,
        "the jobs enqueued after the confirmation are left alone"
    );

    // Nothing matched at confirmation: nothing is done, whatever came since.
    let form = format!("csrf={token}&action=delete&scope=matching&f_queue=later");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert!(page.contains("delete 0 job(s)"), "{page}");
    let confirmed = confirmation(&page);
    enqueue_mail(&db, "later", 3).await;
    let (status, _, location) = post(&app, "/t/jobs/bulk", &confirmed, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().contains("done=delete+0"));
    assert_eq!(
        count(&db, "SELECT count(*) FROM jobs WHERE queue = 'later'").await,
        3
    );

    // A confirmation without its bound (a form from before) acts on nothing.
    let form = format!("csrf={token}&action=delete&scope=matching&f_queue=later&confirm=yes");
    let (status, body, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.starts_with("max_id: "), "{body}");
    let (status, body, _) = post(&app, "/t/jobs/bulk", &format!("{form}&max_id=x1"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM jobs WHERE queue = 'later'").await,
        3
    );
}

/// A bulk action on a filter naming a state it never touches is refused,
/// naming the state, rather than confirmed as "0 job(s)".
#[tokio::test]
async fn a_matching_action_refuses_a_state_it_never_touches() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, |t| t.queue_column = Some("queue".into())).await;
    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = csrf(&page);
    let form = format!("csrf={token}&action=requeue&scope=matching&f_state=queued");
    let (status, body, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.starts_with("state: requeue acts only on"), "{body}");
    assert!(body.contains("not queued"), "{body}");
    let form = format!("csrf={token}&action=cancel&scope=matching&f_state=queued");
    let (status, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("cancel 30 job(s)"), "{page}");
}

/// A bulk action is audited when it starts (who, what, its bound), so one
/// that fails midway, or runs long, is on record; it used to log only once
/// every batch had committed.
#[tokio::test]
async fn a_bulk_action_is_audited_when_it_starts_and_when_it_stops() {
    let lines = crate::common::LogLines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _local = tracing::subscriber::set_default(subscriber);
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, |t| t.queue_column = Some("queue".into())).await;
    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = csrf(&page);
    let form = format!("csrf={token}&action=fail&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    let confirmed = confirmation(&page);
    // The action fails at its first batch.
    db.execute(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom'; END $$;
         CREATE TRIGGER boom BEFORE UPDATE ON jobs FOR EACH ROW WHEN (NEW.state = 'failed') EXECUTE FUNCTION boom();",
    )
    .await;
    lines.clear();
    let (status, _, _) = post(&app, "/t/jobs/bulk", &confirmed, None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let log = lines.text();
    let started = log
        .lines()
        .find(|l| l.contains("dashboard bulk action started"))
        .unwrap_or_else(|| panic!("no start line: {log}"));
    assert!(
        started.contains("action=\"fail\"") || started.contains("action=fail"),
        "{started}"
    );
    assert!(started.contains("max_id=Some("), "{started}");
    assert!(started.contains("user="), "{started}");
    assert!(log.contains("dashboard bulk action stopped"), "{log}");
}

/// The confirmation names the jobs it would touch: the first 20 by id of
/// the matching ones (in a state the action touches), or the selection.
#[tokio::test]
async fn the_confirmation_lists_the_first_jobs_it_would_touch() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, |t| t.queue_column = Some("queue".into())).await;
    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = csrf(&page);
    let queued: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE queue = 'mail' AND state = 'queued' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let listed = |page: &str| -> Vec<i64> {
        let start = page.find(r#"id="confirm-ids""#).expect("a list of ids");
        let list = &page[start..start + page[start..].find("</p>").unwrap()];
        list.split("href=\"/t/jobs/jobs/")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
            .collect()
    };
    // Fail touches the 30 queued mail jobs, not the processing one.
    let form = format!("csrf={token}&action=fail&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(listed(&page), queued[..20], "{page}");
    assert!(page.contains("The first 20"), "{page}");
    let form = format!(
        "csrf={token}&action=fail&scope=selected&id={}&id={}",
        queued[3], queued[7]
    );
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(listed(&page), [queued[3], queued[7]], "{page}");
}

/// The result page sets what a bulk action did against the count the
/// operator confirmed: jobs that left the action's states after the count
/// (fewer) and jobs under its bound that entered them (more) are said, not
/// shown as a plain count the operator would take for the confirmed one.
/// Before, "Done: fail 28" after confirming 30.
#[tokio::test]
async fn the_result_says_when_fewer_or_more_jobs_were_acted_on_than_confirmed() {
    let (db, _) = shared::seed().await;
    let app = router::dashboard(&db, |t| t.queue_column = Some("queue".into())).await;
    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = csrf(&page);
    let done = |location: Option<String>| {
        let location = location.expect("a redirect");
        let text = location[location.find("done=").expect("done") + 5..]
            .split('&')
            .next()
            .unwrap()
            .to_owned();
        (location, text)
    };

    // Fewer: 30 queued mail jobs confirmed, 2 completed before the click.
    let form = format!("csrf={token}&action=fail&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert!(page.contains("fail 30 job(s)"), "{page}");
    let confirmed = confirmation(&page);
    assert!(confirmed.contains("confirmed=30"), "{confirmed}");
    db.execute(
        "UPDATE jobs SET state = 'completed', finished_at = now()
          WHERE id IN (SELECT id FROM jobs WHERE queue = 'mail' AND state = 'queued' ORDER BY id LIMIT 2)",
    )
    .await;
    let (status, body, location) = post(&app, "/t/jobs/bulk", &confirmed, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let (location, text) = done(location);
    assert!(
        text.starts_with("fail+28+of+the+30+job%28s%29+confirmed"),
        "{text}"
    );
    let (_, page) = get(&app, &location).await;
    assert!(
        page.contains(
            "fail 28 of the 30 job(s) confirmed; the other 2 were not (or no longer) in a state it acts on"
        ),
        "{page}"
    );

    // More: 28 failed confirmed for a requeue; a completed one under the
    // bound fails before the click, and is requeued with them.
    let form = format!("csrf={token}&action=requeue&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert!(page.contains("requeue 28 job(s)"), "{page}");
    let confirmed = confirmation(&page);
    db.execute(
        "UPDATE jobs SET state = 'failed'
          WHERE id = (SELECT min(id) FROM jobs WHERE queue = 'mail' AND state = 'completed')",
    )
    .await;
    let (_, _, location) = post(&app, "/t/jobs/bulk", &confirmed, None).await;
    let (location, text) = done(location);
    assert!(
        text.starts_with("requeue+29+job%28s%29%2C+1+more+than+the+28+confirmed"),
        "{text}"
    );
    let (_, page) = get(&app, &location).await;
    assert!(page.contains("1 more than the 28 confirmed"), "{page}");

    // As confirmed: the plain count.
    let form = format!("csrf={token}&action=fail&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert!(page.contains("fail 29 job(s)"), "{page}");
    let (_, _, location) = post(&app, "/t/jobs/bulk", &confirmation(&page), None).await;
    assert_eq!(done(location).1, "fail+29");

    // A count that is not one is refused before anything is done.
    let form = format!(
        "csrf={token}&action=requeue&scope=matching&f_queue=mail&confirm=yes&max_id=40&confirmed=x"
    );
    let (status, body, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.starts_with("confirmed: "), "{body}");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM jobs WHERE queue = 'mail' AND state = 'failed'"
        )
        .await,
        29
    );
}
