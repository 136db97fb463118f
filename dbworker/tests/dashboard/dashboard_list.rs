//! The job list's filter form and columns, through the router: every state
//! is offered (pending was missing).

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use router::get;
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
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
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
