//! A job table named by an SQL keyword (`"order"`), with a standard column
//! renamed to another (`"select"`) and quoted optional columns: the DDL
//! generators, the enqueuer (insert, keys, COPY, the SQL function), a worker
//! and the resetter all work on it.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Enqueuer, JobTable, JobTableOptions, KeyMode, Listen, NewJob, Resetter,
    ResetterOptions, StoreOptions,
    ddl::{
        OptionalColumns, add_jobs_function_sql, admin_functions_sql, enqueue_function_sql,
        job_table_sql, notify_trigger_sql, optional_columns_sql,
    },
    new_worker,
};
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext, Record, RecordId, WorkerOptions};

use common::Db;

const TABLE: &str = "\"order\"";

#[derive(Debug, sqlx::FromRow)]
struct Order {
    id: i64,
}

impl Record for Order {
    fn id(&self) -> RecordId {
        self.id
    }
}

struct Completes;

impl Handler<DbStore<Order>> for Completes {
    async fn handle(
        &self,
        _job: &mut DbJob<Order>,
        _ctx: &JobContext<DbStore<Order>>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn renames() -> HashMap<String, String> {
    HashMap::from([("state".to_owned(), "\"select\"".to_owned())])
}

async fn count(db: &Db, state: &str) -> i64 {
    sqlx::query_scalar(r#"SELECT count(*) FROM "order" WHERE "select" = $1"#)
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_table_named_order_is_enqueued_worked_and_reset() {
    let db = Db::new().await;
    let renames = renames();
    let mut optional = OptionalColumns::default();
    optional.keys = true;
    optional.queue = true;
    let mut ddl = job_table_sql(TABLE, &renames).unwrap();
    ddl.push_str(&optional_columns_sql(TABLE, &renames, optional).unwrap());
    ddl.push_str(&notify_trigger_sql(TABLE, &renames, None).unwrap());
    ddl.push_str(&enqueue_function_sql(TABLE, &renames, optional).unwrap());
    ddl.push_str(&add_jobs_function_sql(TABLE, &renames, optional).unwrap());
    ddl.push_str(&admin_functions_sql(TABLE, &renames, optional).unwrap());
    ddl.push_str(r#"ALTER TABLE "order" ADD COLUMN "from" jsonb NOT NULL DEFAULT '{}';"#);
    db.execute(&ddl).await;

    // The table under an alias that is a keyword too.
    let mut t = JobTableOptions::new(format!("{TABLE} \"select\""));
    t.alternate_column_names = renames.clone();
    t.key_column = Some("\"job_key\"".into());
    t.queue_column = Some("\"queue\"".into());
    let table = JobTable::new(&db.pool, t).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let ids = enqueuer
        .enqueue_many(&[
            NewJob::new().json("from", json!({"n": 1})),
            NewJob::new().json("from", json!({"n": 2})).queue("q"),
        ])
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    for _ in 0..2 {
        enqueuer
            .enqueue(
                &NewJob::new()
                    .json("from", json!({"n": 3}))
                    .key("k", KeyMode::Replace),
            )
            .await
            .unwrap();
    }
    let copied = enqueuer
        .enqueue_copy(&[
            NewJob::new().json("from", json!({"n": 4})),
            NewJob::new().json("from", json!({"n": 5})),
        ])
        .await
        .unwrap();
    assert_eq!(copied, 2);
    let by_sql: i64 =
        sqlx::query_scalar(r#"SELECT "order_enqueue"('{"from": {"n": 6}}', job_key => 'k')"#)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(by_sql > 0);
    assert_eq!(count(&db, "queued").await, 5, "the keyed jobs are one");
    // The bulk and admin functions on the quoted names.
    let added: Vec<i64> = sqlx::query_scalar(r#"SELECT * FROM "order_add_jobs"($1)"#)
        .bind(vec![json!({"fields": {"from": {"n": 7}}, "job_key": "k"})])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(added, [by_sql]);
    let outcome: String =
        sqlx::query_scalar(r#"SELECT outcome FROM "order_reschedule_jobs"($1, num_failures => 0)"#)
            .bind(vec![by_sql])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "done");

    let mut so = StoreOptions::new("quoted");
    so.listen = Listen::TableChannel;
    so.max_num_retries = 0;
    let store = Arc::new(DbStore::new(&db.pool, &table, so).await.unwrap());
    let mut wo = WorkerOptions::new("quoted");
    wo.interval = Duration::from_millis(50);
    wo.num_total_jobs = Some(5);
    tokio::time::timeout(
        Duration::from_secs(60),
        new_worker(store, Completes, wo).unwrap().run(),
    )
    .await
    .expect("the worker finished every job");
    assert_eq!(count(&db, "completed").await, 5);

    // A job left processing by a dead worker goes back to the queue.
    let stalled = enqueuer
        .enqueue(&NewJob::new().json("from", json!({"n": 7})))
        .await
        .unwrap()
        .id();
    sqlx::query(
        r#"UPDATE "order" SET "select" = 'processing', started_at = now() - interval '1 hour',
               last_heartbeat_at = now() - interval '1 hour' WHERE id = $1"#,
    )
    .bind(stalled)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut ro = ResetterOptions::new("quoted");
    ro.stall.stalled_max_age = Duration::from_secs(5);
    let out = Resetter::new(&db.pool, &table, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(
        out.reset.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [stalled]
    );
    assert_eq!(count(&db, "queued").await, 1);
}

#[tokio::test]
async fn an_unquoted_keyword_is_still_refused() {
    let err = JobTableOptions::new("order").validate().unwrap_err();
    assert!(
        err.to_string()
            .contains("\"order\" is an SQL keyword, not a table name or alias"),
        "{err}"
    );
    let err = JobTableOptions::new("jobs where").validate().unwrap_err();
    assert!(
        err.to_string().contains("\"where\" is an SQL keyword"),
        "{err}"
    );
    assert!(JobTableOptions::new("\"order\"").validate().is_ok());
}
