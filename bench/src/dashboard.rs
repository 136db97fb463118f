//! How fast the dashboard's pages answer on a big table: 1,000,000 completed
//! and 100,000 queued rows, and 10,000 workflows of three tasks, each page
//! requested through the router itself.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::ddl::{leader_table_sql, node_table_sql, workflows_sql};
use dbworker::{JobTable, JobTableOptions};
use sqlx::AssertSqlSafe;
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
    // Workflows (10,000 of three tasks: a tenth failed, a tenth running),
    // the registry with three processes and a leader, for the newer pages.
    let ddl = format!(
        "{}{}{}",
        workflows_sql(TABLE, &HashMap::new())?,
        node_table_sql(DEFAULT_NODE_TABLE)?,
        leader_table_sql(DEFAULT_LEADER_TABLE)?
    );
    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&pool).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {TABLE} (state, workflow_id, task_name, finished_at) \
         SELECT CASE WHEN w % 10 = 0 AND t = 3 THEN 'failed' WHEN w % 10 = 1 AND t = 3 THEN 'queued' ELSE 'completed' END, \
         w, 'task' || t, now() FROM generate_series(1, 10000) AS w, generate_series(1, 3) AS t;
         DELETE FROM {DEFAULT_NODE_TABLE}; DELETE FROM {DEFAULT_LEADER_TABLE};
         INSERT INTO {DEFAULT_NODE_TABLE} (id, host, pid, version, queues, handlers, heartbeat_at) \
         SELECT 'h' || i || ':1:x', 'h' || i, 1, '0', ARRAY['default'], 8, now() - i * interval '4 seconds' FROM generate_series(1, 3) AS i;
         INSERT INTO {DEFAULT_LEADER_TABLE} (scope, node_id, term, acquired_at, expires_at) VALUES ('{TABLE}', 'h1:1:x', 1, now(), now() + interval '1 hour');"
    )))
    .execute(&pool)
    .await?;
    // Alone: VACUUM refuses to run in a multi-statement string's transaction.
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TABLE}")))
        .execute(&pool)
        .await?;
    let job: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(id) FROM {TABLE} WHERE state = 'queued'"
    )))
    .fetch_one(&pool)
    .await?;
    let mut options = JobTableOptions::new(TABLE);
    options.workflows = true;
    let table = JobTable::new(&pool, options).await?;
    let mut options = DashboardOptions::new(vec![table]);
    options.node_table = Some(DEFAULT_NODE_TABLE.into());
    options.leader_table = Some(DEFAULT_LEADER_TABLE.into());
    let dashboard = Dashboard::new(&pool, options).await?;
    let app = dashboard.router();
    let pages = [
        ("overview", "/".to_owned()),
        ("job page", format!("/t/{TABLE}/jobs/{job}")),
        ("queues", format!("/t/{TABLE}/queues")),
        ("workflows, first page", format!("/t/{TABLE}/workflows")),
        (
            "workflows, failed (1 in 10)",
            format!("/t/{TABLE}/workflows?state=failed"),
        ),
        (
            "workflows, page 100",
            format!("/t/{TABLE}/workflows?before=5000"),
        ),
        ("a workflow", format!("/t/{TABLE}/workflows/4242")),
        ("processes", "/processes".to_owned()),
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
    // The edges' table holds a foreign key to the job table, which the next
    // workload drops and creates again.
    drop(dashboard);
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {TABLE}_deps")))
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(out)
}
