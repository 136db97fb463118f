//! How fast the dashboard's pages answer on a big table: 1,000,000 completed
//! and 100,000 queued rows, each page requested through the router itself.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::{JobTable, JobTableOptions};
use tower::ServiceExt;

use crate::Result;
use crate::db::{Bench, TABLE};

/// `(page, p50, p95)` over `rounds` requests of each page.
pub(crate) async fn run(
    bench: &Bench,
    completed: u64,
    queued: u64,
    batch: u64,
    rounds: usize,
) -> Result<Vec<(String, Duration, Duration)>> {
    bench.prepare(completed, queued, batch).await?;
    let pool = bench.pool(4).await?;
    let table = JobTable::new(&pool, JobTableOptions::new(TABLE)).await?;
    let dashboard = Dashboard::new(&pool, DashboardOptions::new(vec![table])).await?;
    let app = dashboard.router();
    let pages = [
        ("overview", "/".to_owned()),
        ("jobs, first page", format!("/t/{TABLE}/jobs")),
        (
            "jobs, queued, newest first",
            format!("/t/{TABLE}/jobs?state=queued&order=newest"),
        ),
        (
            "jobs, failure text filter",
            format!("/t/{TABLE}/jobs?failure=timeout"),
        ),
    ];
    let mut out = Vec::new();
    for (name, path) in pages {
        let mut times = Vec::with_capacity(rounds);
        for i in 0..rounds + 2 {
            let started = Instant::now();
            let response = app
                .clone()
                .oneshot(Request::get(path.as_str()).body(Body::empty())?)
                .await?;
            if response.status() != StatusCode::OK {
                return Err(format!("{path}: {}", response.status()).into());
            }
            axum::body::to_bytes(response.into_body(), usize::MAX).await?;
            // Two warm-up requests (prepared statements, caches).
            if i >= 2 {
                times.push(started.elapsed());
            }
        }
        times.sort();
        // Nearest rank: the 50th and 95th percentiles of `rounds` samples.
        let at = |percent: usize| times[(times.len() - 1) * percent / 100];
        out.push((name.to_owned(), at(50), at(95)));
    }
    pool.close().await;
    Ok(out)
}
