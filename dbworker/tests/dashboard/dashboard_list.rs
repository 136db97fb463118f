//! The job list's filter form and columns, through the router: every state
//! is offered (pending was missing); columns named in `hidden_fields` are
//! neither shown nor filtered or suggested on.

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use router::{csrf, get, post};
use workerutil::JobState;

#[tokio::test]
async fn the_state_filter_offers_every_state_pending_included() {
    let (db, _) = shared::seed().await;
    let pending: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, queue) VALUES ('pending', 'mail') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let app = router::dashboard(&db, |t| t.queue_column = Some("queue".into())).await;
    let (status, page) = get(&app, "/t/jobs/jobs").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for state in JobState::ALL {
        let option = format!(r#"<option value="{}">"#, state.as_str());
        assert!(page.contains(&option), "{option} missing: {page}");
    }
    let (status, page) = get(&app, "/t/jobs/jobs?state=pending").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(r#"<option value="pending" selected>"#),
        "{page}"
    );
    assert!(page.contains(&format!("/jobs/{pending}\"")), "{page}");
    assert_eq!(
        page.matches("type=\"checkbox\" name=\"id\"").count(),
        1,
        "{page}"
    );
}

#[tokio::test]
async fn hidden_columns_are_neither_shown_nor_filtered_on() {
    let (db, failed) = shared::seed().await;
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
        })
        .await;
    let mut o = DashboardOptions::new(vec![table]);
    o.hidden_fields = vec![
        "failure_message".into(),
        "worker_hostname".into(),
        "queue".into(),
    ];
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (status, page) = get(&app, "/t/jobs/jobs?state=failed").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("/jobs/{failed}\"")), "{page}");
    for secret in [
        "alert(1)",
        "reports",
        r#"name="failure""#,
        r#"name="queue""#,
    ] {
        assert!(!page.contains(secret), "{secret} shown: {page}");
    }
    assert!(page.contains("<td>[hidden]</td>"), "{page}");
    assert!(
        page.contains("<td>build</td>"),
        "the kind is not hidden: {page}"
    );
    let (_, page) = get(&app, "/t/jobs/jobs?state=processing").await;
    assert!(!page.contains("host-7"), "{page}");
    assert!(
        !page.contains(r#"option value="mail""#),
        "no suggestions: {page}"
    );

    // Filtering on them: refused, naming the parameter; nothing echoed.
    for query in [
        "failure=alert",
        "queue=reports",
        "field=failure_message%3Dx",
    ] {
        let (status, body) = get(&app, &format!("/t/jobs/jobs?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body.contains("hidden"), "{query}: {body}");
    }
    let token = csrf(&page);
    let form = format!("csrf={token}&action=delete&scope=matching&f_failure=alert");
    let (status, body, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.starts_with("failure: "), "{body}");
    assert_eq!(db.state(failed).await, "failed");
}

/// A job's page hides its attempts' failure messages and hosts (in the
/// error history) with the failure message and host columns.
#[tokio::test]
async fn a_jobs_page_hides_its_attempts_messages_with_the_failure_column() {
    let db = crate::common::Db::new().await;
    db.add_columns(|c| c.error_history = true, &[]).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, num_failures, failure_message, finished_at, worker_hostname, errors)
         VALUES ('failed', 1, 'card 4242 declined', now(), 'host-secret',
                 jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'worker', 'host-secret', 'message', 'card 4242 declined')))
         RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let table = db
        .table_with(|t| t.error_history_column = Some("errors".into()))
        .await;
    let mut o = DashboardOptions::new(vec![table]);
    o.hidden_fields = vec!["failure_message".into(), "worker_hostname".into()];
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Error history"), "{page}");
    assert!(!page.contains("4242"), "{page}");
    assert!(!page.contains("host-secret"), "{page}");
}
