//! Enqueueing: an order and its confirmation e-mail in one transaction, a bulk
//! insert, priorities, a delayed job, and a job key that debounces repeated
//! requests — then a worker that runs them by priority.
//!
//! ```sh
//! cargo run --example enqueue
//! ```
//!
//! Zero-config like the quickstart: a throwaway PostgreSQL cluster, or a
//! scratch database on `DATABASE_URL`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Enqueued, Enqueuer, Handling, JobTable, JobTableOptions, KeyMode, NewJob,
    StoreOptions,
    ddl::{OptionalColumns, job_table_sql, optional_columns_sql},
    new_worker,
};
use dbworker_testkit::TestDatabase;
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct MailJob {
    id: i64,
    payload: serde_json::Value,
    priority: i32,
}

impl Record for MailJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// "Sends" each mail by recording it.
struct Mailer {
    sent: Arc<Mutex<Vec<String>>>,
}
impl Handler<DbStore<MailJob>> for Mailer {
    async fn handle(
        &self,
        job: &mut DbJob<MailJob>,
        _ctx: &JobContext<DbStore<MailJob>>,
    ) -> Result<(), HandlerError> {
        let r = job.record();
        let line = format!(
            "p{} {}",
            r.priority,
            r.payload["subject"].as_str().unwrap_or("?")
        );
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool(10).await?;
    let mut ddl = job_table_sql("mail_jobs", &Default::default())?;
    ddl.push_str(&optional_columns_sql(
        "mail_jobs",
        &Default::default(),
        OptionalColumns::all(),
    )?);
    // `OptionalColumns::all()` includes the jsonb `payload` column.
    ddl.push_str("CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL);");
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;

    // The job table, described and checked once: the enqueuer and the store take it.
    let mut options = JobTableOptions::new("mail_jobs j");
    options.key_column = Some("job_key".into());
    options.queue_column = Some("queue".into());
    options.priority_column = Some("priority".into());
    // Claims take the highest priority first (the generated index serves it).
    options.order_by = Some("j.priority DESC, j.id".into());
    let table = JobTable::new(&pool, options).await?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;

    // 1. The order and its confirmation commit together, or not at all.
    let mut tx = pool.begin().await?;
    let order: i64 = sqlx::query_scalar("INSERT INTO orders (item) VALUES ('book') RETURNING id")
        .persistent(false)
        .fetch_one(&mut *tx)
        .await?;
    let mail = NewJob::new()
        .json(
            "payload",
            json!({"subject": format!("order {order} confirmed")}),
        )
        .priority(5);
    enqueuer.enqueue_in(&mut tx, &mail).await?;
    tx.commit().await?;

    // 2. Three newsletters: one statement.
    let newsletters: Vec<NewJob> = (1..=3)
        .map(|n| NewJob::new().json("payload", json!({"subject": format!("newsletter {n}")})))
        .collect();
    enqueuer.enqueue_many(&newsletters).await?;

    // 3. A reminder for tomorrow: not run today.
    let reminder = NewJob::new()
        .json("payload", json!({"subject": "reminder"}))
        .run_after(Duration::from_secs(24 * 3600));
    enqueuer.enqueue(&reminder).await?;

    // 4. Three "your cart changed" requests within a second: one mail, the last.
    let mut outcomes = Vec::new();
    for n in 1..=3 {
        let digest = NewJob::new()
            .json("payload", json!({"subject": format!("cart digest v{n}")}))
            .priority(1)
            .key("cart-digest:user-7", KeyMode::Replace);
        outcomes.push(enqueuer.enqueue(&digest).await?);
    }
    println!("cart digest enqueues: {outcomes:?}");
    assert!(matches!(outcomes[0], Enqueued::Inserted(_)));
    assert!(matches!(outcomes[2], Enqueued::Updated(id) if id == outcomes[0].id()));

    // The worker takes the highest priority first (the generated index serves it).
    let mut store_options = StoreOptions::new("mailer");
    store_options.handling = Handling::Heartbeat;
    let store = Arc::new(DbStore::new(&pool, &table, store_options).await?);
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut worker_options = WorkerOptions::new("mailer");
    worker_options.num_handlers = 1;
    worker_options.claim_ahead = Some(0);
    worker_options.num_total_jobs = Some(5);
    let handler = Mailer { sent: sent.clone() };
    new_worker(store, handler, worker_options)?.run().await;

    let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("sent in order: {sent:?}");
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM mail_jobs WHERE state = 'queued'")
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
    println!("still waiting: {waiting} (the reminder)");
    assert_eq!(sent.len(), 5);
    assert_eq!(sent[0], format!("p5 order {order} confirmed"));
    assert_eq!(sent[1], "p1 cart digest v3");
    assert_eq!(waiting, 1);
    pool.close().await;
    Ok(())
}
