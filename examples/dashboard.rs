//! The dashboard mounted in an application: an axum app with its own routes
//! serves dbworker's dashboard under `/admin/jobs` (on 127.0.0.1; behind a
//! bearer token when `DASHBOARD_TOKEN` is set, and in `--check`), over a
//! seeded job table that a worker is processing.
//!
//! ```sh
//! cargo run --example dashboard            # then open the printed address
//! cargo run --example dashboard -- --check # request the pages once and exit
//! ```

use dbworker::Service;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use dbworker::dashboard::{Auth, Dashboard, DashboardOptions};
use dbworker::{
    DbJob, DbStore, JobTable, JobTableOptions, StoreOptions,
    control::DEFAULT_PAUSE_TABLE,
    ddl::{OptionalColumns, job_table_sql, optional_columns_sql, pause_table_sql},
    new_worker,
};
use dbworker_testkit::TestDatabase;
use tower::ServiceExt;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Job {
    id: i64,
    payload: serde_json::Value,
}

impl Record for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Slow, and fails the jobs of customer 13.
struct Send;
impl Handler<DbStore<Job>> for Send {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if job.record().payload["customer_id"] == "13" {
            return Err(HandlerError::non_retryable(
                "customer 13 has no mail server",
            ));
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    let db = TestDatabase::new().await?;
    let pool = db.pool(8).await?;
    let mut columns = OptionalColumns::default();
    columns.queue = true;
    columns.retention = true; // the index the history reads through
    let mut ddl = job_table_sql("jobs", &Default::default())?;
    ddl.push_str(&optional_columns_sql("jobs", &Default::default(), columns)?);
    ddl.push_str(&pause_table_sql(DEFAULT_PAUSE_TABLE)?);
    ddl.push_str(&dbworker::ddl::history_table_sql(
        dbworker::history::DEFAULT_HISTORY_TABLE,
    )?);
    ddl.push_str(
        "ALTER TABLE jobs ADD COLUMN payload jsonb NOT NULL DEFAULT '{}';
         INSERT INTO jobs (queue, payload) SELECT CASE WHEN i % 3 = 0 THEN 'reports' ELSE 'mail' END,
                jsonb_build_object('customer_id', (i % 20)::text, 'api_key', 'secret-' || i)
         FROM generate_series(1, 300) AS i;",
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, described once: the store and the dashboard both take it.
    let mut to = JobTableOptions::new("jobs j");
    to.queue_column = Some("queue".into());
    to.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
    let table = JobTable::new(&pool, to).await?;

    let so = StoreOptions::new("app");
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let mut wo = WorkerOptions::new("app");
    wo.num_handlers = 2;
    let worker = new_worker(store, Send, wo)?;
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    // The history the overview's charts read: each closed minute, recorded
    // once whichever process records it.
    let history = dbworker::history::History::new(&pool, &table, Default::default()).await?;
    let stop_history = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop_history.clone();
        async move { history.run(stop).await }
    });

    let mut options = DashboardOptions::new(vec![table]);
    // Behind a bearer token when checking (or with DASHBOARD_TOKEN set); open
    // on the loopback address otherwise, so a browser can just look.
    let token = std::env::var("DASHBOARD_TOKEN")
        .ok()
        .or_else(|| check.then(|| "let-me-in".to_owned()));
    if let Some(token) = &token {
        options.auth = Auth::Bearer {
            admin: Some(token.clone()),
            read_only: None,
        };
    }
    options.hidden_fields = vec!["api_key".into()];
    let dashboard = Dashboard::new(&pool, options).await?;
    let app = Router::new()
        .route(
            "/",
            axum::routing::get(|| async { "the application; its job dashboard is at /admin/jobs" }),
        )
        .nest("/admin/jobs", dashboard.router());

    if let (true, Some(token)) = (check, &token) {
        for path in [
            "/admin/jobs",
            "/admin/jobs/t/jobs/jobs?state=queued",
            "/admin/jobs/t/jobs/queues",
        ] {
            let request = Request::get(path)
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(Body::empty())?;
            let response = app.clone().oneshot(request).await?;
            println!("GET {path} -> {}", response.status());
        }
        let anonymous = app
            .clone()
            .oneshot(Request::get("/admin/jobs").body(Body::empty())?)
            .await?;
        println!(
            "GET /admin/jobs without the token -> {}",
            anonymous.status()
        );
        shutdown.immediate();
        run.await?;
        stop_history.cancel();
        pool.close().await;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    println!(
        "dashboard: http://{}/admin/jobs (Ctrl-C stops)",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    shutdown.graceful();
    run.await?;
    stop_history.cancel();
    pool.close().await;
    Ok(())
}
