//! Bad query parameters on the dashboard's job list, through the router: an
//! unknown column, a key path into a column that is not JSON, malformed
//! cursors and oversized values each answer 400 naming the parameter, echo
//! the input cut short, and leave the next request unaffected.

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use router::get;

#[tokio::test]
async fn bad_list_parameters_answer_400_naming_the_parameter() {
    let (db, failed) = shared::seed().await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let long = "x".repeat(10_000);
    let cases = [
        ("field=nosuchcol%3D1", "field", "nosuchcol"),
        ("field=nosuchcol.k%3D1", "field", "nosuchcol"),
        ("field=state.k%3D1", "field", "JSON"),
        (&format!("field={long}") as &str, "field", "xxx"),
        ("after=abc", "after", "abc"),
        (
            "after=1&after_value=abc&sort=failures",
            "after_value",
            "abc",
        ),
        (
            &format!("after=1&after_value={long}&sort=queued_at"),
            "after_value",
            "xxx",
        ),
        (&format!("state={long}"), "state", "xxx"),
        (&format!("sort={long}"), "sort", "xxx"),
    ];
    for (query, parameter, echoed) in cases {
        let (status, body) = get(&app, &format!("/t/jobs/jobs?{query}")).await;
        let shown = &query[..query.len().min(60)];
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shown}: {body}");
        assert!(
            body.starts_with(&format!("{parameter}: ")) && body.contains(echoed),
            "{shown}: {body}"
        );
        // The input echoed at most cut short, never whole; no driver text.
        assert!(body.chars().count() < 300, "{shown}: {body}");
        assert!(!body.contains("database error"), "{shown}: {body}");
    }

    // The requests after them are served as before, good filters included.
    let (status, page) = get(&app, "/t/jobs/jobs?field=payload.customer_id%3D42").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("/jobs/{failed}\"")), "{page}");
    let (status, page) = get(&app, "/t/jobs/jobs?field=queue%3Dreports&state=failed").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("/jobs/{failed}\"")), "{page}");
    let (status, page) = get(&app, "/t/jobs/jobs?sort=failures&order=newest").await;
    assert_eq!(status, StatusCode::OK, "{page}");
}
