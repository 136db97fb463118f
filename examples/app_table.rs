//! The tutorial's worker: an application's own job table with renamed columns,
//! a view joining the `repo` table, a custom scan function, dequeue order by
//! (repository_id, id), and a handler writing through the job's transaction.
//!
//! ```sh
//! cargo run --example app_table
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, JobTable, JobTableOptions, StoreOptions, ddl::job_table_sql, new_worker,
};
use dbworker_testkit::TestDatabase;
use sqlx::Row;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

/// A job with the repository it is about, read through the view.
#[derive(Debug)]
struct IndexJob {
    id: i64,
    repository_id: i32,
    repository_name: String,
}

impl Record for IndexJob {
    fn id(&self) -> i64 {
        self.id
    }
}

struct Indexer;
impl Handler<DbStore<IndexJob>> for Indexer {
    async fn handle(
        &self,
        job: &mut DbJob<IndexJob>,
        _ctx: &JobContext<DbStore<IndexJob>>,
    ) -> Result<(), HandlerError> {
        let (id, repo, name) = (
            job.record().id,
            job.record().repository_id,
            job.record().repository_name.clone(),
        );
        println!("indexing job {id}: repository {repo} ({name})");
        // Every write goes through the transaction that locks the job row: an
        // unsuccessful attempt leaves no trace in the database.
        let tx = job.tx().expect("transactional handling");
        sqlx::query("INSERT INTO repo_index (repository_id, job_id, summary) VALUES ($1, $2, $3)")
            .bind(repo)
            .bind(id)
            .bind(format!("indexed {name}"))
            .persistent(false)
            .execute(tx)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;

    // Step 1: the job table (with `state` stored as `status`) and a view.
    let renames: HashMap<String, String> = [("state".to_owned(), "status".to_owned())].into();
    sqlx::raw_sql(sqlx::AssertSqlSafe(job_table_sql(
        "example_jobs",
        &renames,
    )?))
    .execute(&pool)
    .await?;
    sqlx::raw_sql(
        "CREATE TABLE repo (id integer PRIMARY KEY, name text NOT NULL);
         ALTER TABLE example_jobs ADD COLUMN repository_id integer NOT NULL REFERENCES repo (id);
         CREATE VIEW example_jobs_with_repository_name AS
             SELECT ej.*, r.name AS repository_name FROM example_jobs ej JOIN repo r ON r.id = ej.repository_id;
         CREATE TABLE repo_index (repository_id integer NOT NULL, job_id bigint NOT NULL, summary text NOT NULL);
         INSERT INTO repo VALUES (1, 'github.com/acme/api'), (2, 'github.com/acme/web'), (3, 'github.com/acme/cli');
         INSERT INTO example_jobs (repository_id) VALUES (3), (1), (2), (1), (3), (2);",
    )
    .execute(&pool)
    .await?;

    // Step 2: the job table, described once (its renamed column, the view
    // records are read through) and checked against the database.
    let mut table_options = JobTableOptions::new("example_jobs j");
    table_options.view_name = Some("example_jobs_with_repository_name v".into());
    table_options.alternate_column_names = renames;
    // What a claim reads of each row (in the scan's order), and in what order
    // claims take them.
    table_options.column_expressions = vec![
        "v.id".into(),
        "v.repository_id".into(),
        "v.repository_name".into(),
    ];
    table_options.order_by = Some("v.repository_id, v.id".into());
    let table = JobTable::new(&pool, table_options).await?;

    // Step 3: how to scan a row, and the store.
    let scan = |row: &sqlx::postgres::PgRow| {
        Ok(IndexJob {
            id: row.try_get(0)?,
            repository_id: row.try_get(1)?,
            repository_name: row.try_get(2)?,
        })
    };
    let mut options = StoreOptions::new("example_job_worker_store");
    options.stall.max_num_resets = 5;
    options.stall.stalled_max_age = Duration::from_secs(5);
    let store = Arc::new(DbStore::with_scan(&pool, &table, options, scan).await?);

    // Step 4: the worker; one handler so the order is easy to see.
    let mut worker_options = WorkerOptions::new("example_job_worker");
    worker_options.num_total_jobs = Some(6);
    worker_options.interval = Duration::from_millis(100);
    worker_options.heartbeat_interval = Duration::from_millis(500);
    worker_options.heartbeat_failure_limit = Some(Duration::from_secs(3));
    new_worker(store, Indexer, worker_options)?.run().await;

    let order: Vec<(i32, i64)> =
        sqlx::query_as("SELECT repository_id, job_id FROM repo_index ORDER BY ctid")
            .persistent(false)
            .fetch_all(&mut *pool.begin().await?)
            .await?;
    println!("processed in order (repository_id, job id): {order:?}");
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "dequeued by (repository_id, id)");
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM example_jobs WHERE status = 'completed'")
            .persistent(false)
            .fetch_one(&mut *pool.begin().await?)
            .await?;
    assert_eq!(done, 6);
    println!("all 6 jobs completed");
    pool.close().await;
    Ok(())
}
