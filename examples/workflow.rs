//! Workflows: a diamond of tasks (fetch, then resize and scan, then publish),
//! a task that runs even though its upstream failed, and a retry of a failed
//! upstream that brings its canceled dependent back — with one worker.
//!
//! ```sh
//! cargo run --example workflow
//! ```
//!
//! Zero-config like the quickstart: a throwaway PostgreSQL cluster, or a
//! scratch database on `DATABASE_URL`.

use std::sync::{Arc, Mutex};

use dbworker::{
    DbJob, DbStore, DependencyPolicy, Handling, JobTable, JobTableOptions, NewJob, StoreOptions,
    admin::Admin,
    ddl::{job_table_sql, workflows_sql},
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use dbworker_testkit::TestDatabase;
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Step {
    id: i64,
    payload: serde_json::Value,
}

impl Record for Step {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Runs each step by recording its name; a step whose payload says
/// `"fail": true` fails for good.
struct Steps {
    ran: Arc<Mutex<Vec<String>>>,
}
impl Handler<DbStore<Step>> for Steps {
    async fn handle(
        &self,
        job: &mut DbJob<Step>,
        _ctx: &JobContext<DbStore<Step>>,
    ) -> Result<(), HandlerError> {
        let p = &job.record().payload;
        let name = p["step"].as_str().unwrap_or("?").to_owned();
        self.ran
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name);
        if p["fail"] == json!(true) {
            return Err(HandlerError::non_retryable("the scanner is down"));
        }
        Ok(())
    }
}

async fn run_worker(
    pool: &sqlx::PgPool,
    table: &JobTable,
    ran: &Arc<Mutex<Vec<String>>>,
    jobs: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut options = StoreOptions::new("steps");
    options.handling = Handling::Transactional;
    options.max_num_retries = 0;
    let store = Arc::new(DbStore::new(pool, table, options).await?);
    let mut worker_options = WorkerOptions::new("steps");
    worker_options.num_handlers = 1;
    worker_options.num_total_jobs = Some(jobs);
    new_worker(store, Steps { ran: ran.clone() }, worker_options)?
        .run()
        .await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    let mut ddl = job_table_sql("steps", &Default::default())?;
    ddl.push_str("ALTER TABLE steps ADD COLUMN payload jsonb NOT NULL DEFAULT '{}';\n");
    ddl.push_str(&workflows_sql("steps", &Default::default())?);
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, with workflows, described and checked once: workflows,
    // the stores and the admin take it.
    let mut to = JobTableOptions::new("steps j");
    to.workflows = true;
    let table = JobTable::new(&pool, to).await?;
    let workflows = Workflows::new(&pool, &table).await?;
    let step = |name: &str| NewJob::new().json("payload", json!({ "step": name }));
    let failing = |name: &str| NewJob::new().json("payload", json!({ "step": name, "fail": true }));
    let enqueued = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("fetch", step("fetch")))
                .task(Task::new("resize", step("resize")).after(["fetch"]))
                .task(Task::new("scan", failing("scan")).after(["fetch"]))
                // Waits for both, and runs even if the scan fails.
                .task(
                    Task::new("publish", step("publish"))
                        .after(["resize"])
                        .after_with(["scan"], DependencyPolicy::IgnoreFailed),
                )
                // Needs a successful scan: canceled when it fails.
                .task(Task::new("index", step("index")).after(["scan"])),
        )
        .await?;

    let ran = Arc::new(Mutex::new(Vec::new()));
    run_worker(&pool, &table, &ran, 4).await?;
    let status = workflows.status(enqueued.id).await?.expect("the workflow");
    println!("ran: {:?}", ran.lock().unwrap_or_else(|e| e.into_inner()));
    println!("after the first run: {:?}", status.counts);
    let index = status
        .tasks
        .iter()
        .find(|t| t.name == "index")
        .expect("index");
    println!(
        "index: {} (blocked by job {:?})",
        index.state, index.blocked_by
    );
    assert_eq!(index.state, "canceled");

    // The scanner is back: retry the scan; index waits again, then runs.
    let scan = enqueued.id_of("scan").expect("scan");
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE steps SET payload = '{\"step\": \"scan\"}' WHERE id = $1")
        .bind(scan)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    let admin = Admin::new(&pool, &table).await?;
    admin.requeue(scan).await?;
    run_worker(&pool, &table, &ran, 2).await?;
    let status = workflows.status(enqueued.id).await?.expect("the workflow");
    let ran = ran.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("ran: {ran:?}");
    println!("after the retry: {:?}", status.counts);
    assert_eq!(ran[0], "fetch");
    assert_eq!(ran[3], "publish");
    assert_eq!(&ran[4..], ["scan", "index"]);
    assert_eq!(status.counts.get("completed"), Some(&5));
    pool.close().await;
    Ok(())
}
