//! Bad schemas, bad configuration, unreachable servers and odd rows on real
//! Postgres: each is reported at start-up with its name and cause, and a bad
//! row (a panicking scan, NULL counters) never stops the worker, makes a job
//! loop or fails it early.

use crate::common;

use dbworker::{
    DbJob, DbStore, Enqueuer, Error, Handling, JobTable, JobTableOptions, NewJob, Resetter,
    ResetterOptions, StoreOptions, ddl::job_table_sql, new_worker,
};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use common::{Completes, Db, Job};

async fn exec(db: &Db, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&db.pool)
        .await
        .unwrap();
}

/// What `JobTable::new` (which checks the table at start-up) reports.
async fn table_error(pool: sqlx::PgPool, t: JobTableOptions) -> String {
    JobTable::new(&pool, t).await.unwrap_err().to_string()
}

/// Fails every attempt with a retryable error and counts the attempts.
#[derive(Default)]
struct AlwaysFails(AtomicUsize);
impl Handler<DbStore<Job>> for AlwaysFails {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(std::io::Error::other("upstream down").into())
    }
}

fn worker_options() -> WorkerOptions {
    let mut o = WorkerOptions::new("robust");
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    // Bounds the run even if retries were ignored (the old bug looped forever).
    o.max_active_time = Some(Duration::from_secs(3));
    o
}

#[tokio::test]
async fn a_nullable_counter_without_default_is_reported_at_start_up() {
    let db = Db::new().await;
    exec(&db, "ALTER TABLE jobs ALTER COLUMN num_failures DROP NOT NULL, ALTER COLUMN num_failures DROP DEFAULT").await;
    let err = table_error(db.pool.clone(), Db::table_options()).await;
    assert!(
        err.contains("column jobs.num_failures is a counter but nullable with no default"),
        "{err}"
    );
}

/// A NOT NULL `process_after` (or `finished_at`, or another column dbworker
/// writes NULL to) is named at start-up, beside the other problems:
/// dbworker writes NULL there for a job due at once (a COPY without a
/// run-at, a requeue, a hand-back at shutdown, an operator's requeue), which
/// would fail each of those writes later.
#[tokio::test]
async fn a_not_null_process_after_is_reported_at_start_up() {
    let db = Db::new().await;
    exec(
        &db,
        "ALTER TABLE jobs ALTER COLUMN process_after SET DEFAULT now(), ALTER COLUMN process_after SET NOT NULL,
             ALTER COLUMN finished_at SET DEFAULT now(), ALTER COLUMN finished_at SET NOT NULL,
             ALTER COLUMN num_failures DROP NOT NULL, ALTER COLUMN num_failures DROP DEFAULT",
    )
    .await;
    let err = table_error(db.pool.clone(), Db::table_options()).await;
    assert!(
        err.contains("column jobs.process_after is NOT NULL")
            && err.contains("DROP NOT NULL")
            && err.contains("column jobs.finished_at is NOT NULL")
            && err.contains("column jobs.num_failures is a counter"),
        "{err}"
    );
}

/// Two things no column check saw, named together at start-up: a
/// `started_at` rounded coarser than microseconds (a new claim's token
/// could equal the one before it) and transactions that default to a
/// snapshot level (a claim or a signal's check would read a stale row).
#[tokio::test]
async fn a_coarse_started_at_and_a_snapshot_isolation_default_are_reported_at_start_up() {
    let db = Db::new().await;
    exec(
        &db,
        "ALTER TABLE jobs ALTER COLUMN started_at TYPE timestamptz(0);
         DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$;",
    )
    .await;
    // Connections opened from here on start with the database's setting.
    let pool = db.db.pool(2).await.unwrap();
    let err = table_error(pool.clone(), Db::table_options()).await;
    assert!(
        err.contains(
            "column jobs.started_at is timestamptz(0), but claim tokens need its microseconds"
        ),
        "{err}"
    );
    assert!(
        err.contains("transactions default to repeatable read"),
        "{err}"
    );
    pool.close().await;
}

#[tokio::test]
async fn a_null_failure_count_still_honours_max_num_retries_in_both_modes() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        exec(
            &db,
            "ALTER TABLE jobs ALTER COLUMN num_failures DROP NOT NULL",
        )
        .await;
        let id = db.enqueue(1, json!({})).await[0];
        exec(&db, "UPDATE jobs SET num_failures = NULL").await;
        let mut o = db.options();
        o.handling = handling;
        o.max_num_retries = 1;
        let store = db.store_on(&db.table().await, o).await;
        let handler = Arc::new(AlwaysFails::default());
        new_worker(store, handler.clone(), worker_options())
            .unwrap()
            .run()
            .await;
        assert_eq!(
            handler.0.load(Ordering::SeqCst),
            2,
            "{handling:?}: one try, one retry"
        );
        assert_eq!(db.state(id).await, "failed", "{handling:?}");
        let failures: i32 = db
            .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
            .await;
        assert_eq!(failures, 2, "{handling:?}");
    }
}

#[tokio::test]
async fn a_null_reset_count_is_requeued_on_its_first_stall() {
    let db = Db::new().await;
    exec(
        &db,
        "ALTER TABLE jobs ALTER COLUMN num_resets DROP NOT NULL",
    )
    .await;
    let id = db.enqueue(1, json!({})).await[0];
    exec(&db, "UPDATE jobs SET num_resets = NULL, state = 'processing', started_at = now(), last_heartbeat_at = now() - interval '1 hour'").await;
    let table = JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap();
    let mut ro = ResetterOptions::new("r");
    ro.stall.max_num_resets = 3;
    let out = Resetter::new(&db.pool, &table, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len(), 1, "{out:?}");
    assert!(out.failed.is_empty(), "{out:?}");
    assert_eq!(db.state(id).await, "queued");
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(resets, 1);
}

/// A lazy pool to `options`, so that connecting happens in `JobTable::new`
/// (or `DbStore::new`).
fn lazy_pool(options: PgConnectOptions) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(options)
}

#[tokio::test]
async fn an_unreachable_server_is_reported_with_its_cause_and_address_quickly() {
    // A port nothing listens on: refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("someone")
        .password("hunter2");
    let start = Instant::now();
    let err = JobTable::new(&lazy_pool(options), Db::table_options())
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!text.contains("pool timed out"), "{text}");

    // A server that accepts the TCP connection and never answers: the timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut t = Db::table_options();
    t.connect_timeout = Duration::from_millis(300);
    let start = Instant::now();
    let err = table_error(
        lazy_pool(PgConnectOptions::new().host("127.0.0.1").port(port)),
        t,
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("connect timeout of 300ms"), "{err}");

    // A store probes the server again with its table's connect timeout: a
    // table checked on a reachable database, the store's pool to the silent one.
    let db = Db::new().await;
    let table = db
        .table_with(|t| t.connect_timeout = Duration::from_millis(300))
        .await;
    let o = Db::options_for_tests();
    let start = Instant::now();
    let err = DbStore::<Job>::new(
        &lazy_pool(PgConnectOptions::new().host("127.0.0.1").port(port)),
        &table,
        o,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("connect timeout of 300ms"), "{err}");
    drop(silent);
}

#[tokio::test]
async fn a_server_side_refusal_is_reported_as_the_server_said() {
    let db = Db::new().await;
    let options: PgConnectOptions = db.db.url().parse().unwrap();
    let err = table_error(
        lazy_pool(options.database("no_such_database_here")),
        Db::table_options(),
    )
    .await;
    assert!(err.contains("cannot connect to the database at"), "{err}");
    assert!(
        err.contains("\"no_such_database_here\" does not exist"),
        "{err}"
    );
}

#[tokio::test]
async fn missing_privileges_are_named_at_start_up() {
    let db = Db::new().await;
    let role = format!("limited_{}", db.db.name());
    let role = &role[..role.len().min(63)];
    exec(&db, &format!("CREATE ROLE \"{role}\" LOGIN")).await;
    exec(
        &db,
        &format!(
            "GRANT CONNECT ON DATABASE \"{}\" TO \"{role}\"",
            db.db.name()
        ),
    )
    .await;
    exec(&db, &format!("GRANT USAGE ON SCHEMA public TO \"{role}\"")).await;
    let options: PgConnectOptions = db.db.url().parse().unwrap();
    let pool = lazy_pool(options.username(role));

    let err = table_error(pool.clone(), Db::table_options()).await;
    assert!(
        err.contains(&format!(
            "role {role} lacks SELECT on table jobs: GRANT SELECT ON jobs TO {role}"
        )),
        "{err}"
    );
    assert!(!err.contains("does not exist"), "{err}");
    // SELECT is all a table needs; the worker's store asks for UPDATE.
    exec(&db, &format!("GRANT SELECT ON jobs TO \"{role}\"")).await;
    let table = JobTable::new(&pool, Db::table_options())
        .await
        .expect("SELECT is enough for the table");
    let err = DbStore::<Job>::new(&pool, &table, db.options())
        .await
        .expect_err("a worker needs UPDATE")
        .to_string();
    assert!(
        err.contains(&format!(
            "role {role} lacks UPDATE on table jobs, which a worker needs: GRANT UPDATE ON jobs TO {role}"
        )),
        "{err}"
    );
    exec(&db, &format!("GRANT UPDATE ON jobs TO \"{role}\"")).await;
    DbStore::<Job>::new(&pool, &table, db.options())
        .await
        .expect("enough privileges");

    // A worker's grants do not let it enqueue: the enqueuer names what it
    // lacks, with the statement that gives it, before any insert fails.
    let enqueuer_error = || async {
        Enqueuer::new(&pool, &table)
            .await
            .expect_err("too few privileges to enqueue")
            .to_string()
    };
    let err = enqueuer_error().await;
    assert!(
        err.contains(&format!(
            "role {role} lacks INSERT on table jobs, which enqueueing needs: GRANT INSERT ON jobs TO {role}"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "role {role} lacks USAGE on sequence public.jobs_id_seq"
        )),
        "{err}"
    );
    exec(&db, &format!("GRANT INSERT ON jobs TO \"{role}\"")).await;
    let err = enqueuer_error().await;
    assert!(!err.contains("lacks INSERT"), "{err}");
    assert!(
        err.contains(&format!(
            "GRANT USAGE ON SEQUENCE public.jobs_id_seq TO {role}"
        )),
        "{err}"
    );
    exec(
        &db,
        &format!("GRANT USAGE ON SEQUENCE jobs_id_seq TO \"{role}\""),
    )
    .await;
    let enqueuer = Enqueuer::new(&pool, &table)
        .await
        .expect("enough privileges to enqueue");
    enqueuer
        .enqueue(&NewJob::new())
        .await
        .expect("the enqueue the check promised");
    pool.close().await;
    exec(
        &db,
        &format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""),
    )
    .await;
}

#[tokio::test]
async fn a_table_found_through_search_path_works_end_to_end() {
    let db = Db::new().await;
    exec(&db, "CREATE SCHEMA app").await;
    exec(
        &db,
        &job_table_sql("app.app_jobs", &HashMap::new()).unwrap(),
    )
    .await;
    exec(&db, "INSERT INTO app.app_jobs DEFAULT VALUES").await;
    let options: PgConnectOptions = db.db.url().parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(5)
        .connect_with(options.options([("search_path", "public,app")]))
        .await
        .unwrap();

    #[derive(Debug, sqlx::FromRow)]
    struct AppJob {
        id: i64,
    }
    impl workerutil::Record for AppJob {
        fn id(&self) -> i64 {
            self.id
        }
    }
    struct Done;
    impl Handler<DbStore<AppJob>> for Done {
        async fn handle(
            &self,
            _job: &mut DbJob<AppJob>,
            _ctx: &JobContext<DbStore<AppJob>>,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }
    let table = JobTable::new(&pool, JobTableOptions::new("app_jobs j"))
        .await
        .expect("found through search_path");
    let o = StoreOptions::new("app");
    let store = Arc::new(
        DbStore::new(&pool, &table, o)
            .await
            .expect("found through search_path"),
    );
    let mut wo = worker_options();
    wo.num_total_jobs = Some(1);
    new_worker(store, Done, wo).unwrap().run().await;
    let state: String = sqlx::query_scalar("SELECT state FROM app.app_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "completed");
}

#[tokio::test]
async fn a_32_bit_id_is_rejected_at_start_up_with_the_fix() {
    let db = Db::new().await;
    exec(&db, &job_table_sql("int_jobs", &HashMap::new()).unwrap()).await;
    exec(&db, "ALTER TABLE int_jobs ALTER COLUMN id TYPE integer").await;
    let err = table_error(db.pool.clone(), JobTableOptions::new("int_jobs j")).await;
    assert!(err.contains("column int_jobs.id has type int4"), "{err}");
    assert!(
        err.contains("ALTER TABLE int_jobs ALTER COLUMN id TYPE bigint"),
        "{err}"
    );
}

#[tokio::test]
async fn a_trailing_keyword_is_not_taken_as_an_alias() {
    let db = Db::new().await;
    for table in ["jobs AS", "jobs where", "jobs j join"] {
        let err = table_error(db.pool.clone(), JobTableOptions::new(table)).await;
        assert!(
            err.contains("invalid option `table_name`"),
            "{table}: {err}"
        );
    }
}

#[tokio::test]
async fn long_table_names_get_every_index() {
    let db = Db::new().await;
    for len in [62, 63] {
        let name = format!("j{}", "x".repeat(len - 1));
        exec(&db, &job_table_sql(&name, &HashMap::new()).unwrap()).await;
        let indexes: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_indexes WHERE tablename = $1")
                .bind(&name)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            indexes, 3,
            "{len} bytes: primary key, dequeue and processing indexes"
        );
    }
}

#[tokio::test]
async fn a_scan_that_panics_fails_that_row_and_the_worker_goes_on() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        let ids = db.enqueue(3, json!({})).await;
        exec(
            &db,
            &format!("UPDATE jobs SET payload = 'null' WHERE id = {}", ids[1]),
        )
        .await;
        // Reads the payload's "n" with a plain `get`, which panics on the row
        // whose payload has none.
        let scan = |row: &sqlx::postgres::PgRow| {
            use sqlx::Row;
            let payload: serde_json::Value = row.get("payload");
            assert!(!payload.is_null(), "payload is NULL");
            Ok(Job {
                id: row.get("id"),
                payload,
                cost: row.get("cost"),
            })
        };
        let mut o = StoreOptions::new("panicky");
        o.handling = handling;
        o.stall.stalled_max_age = Duration::from_secs(5);
        let store = std::sync::Arc::new(
            dbworker::DbStore::with_scan(&db.pool, &db.table().await, o, scan)
                .await
                .unwrap(),
        );
        let mut wo = worker_options();
        wo.num_total_jobs = Some(2);
        let summary = new_worker(store, Completes, wo).unwrap().run().await;
        assert_eq!(summary.dequeued, 2, "{handling:?}");
        assert_eq!(db.state(ids[0]).await, "completed", "{handling:?}");
        assert_eq!(db.state(ids[2]).await, "completed", "{handling:?}");
        assert_eq!(db.state(ids[1]).await, "failed", "{handling:?}");
        let message: String = db
            .scalar("SELECT failure_message FROM jobs WHERE id = $1", ids[1])
            .await;
        assert!(
            message.contains("the scan panicked: payload is NULL"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_poll_interval_below_the_minimum_is_an_error() {
    let db = Db::new().await;
    let store = db.store(Handling::Heartbeat).await;
    let mut o = worker_options();
    o.interval = Duration::from_nanos(1);
    let err = new_worker(store, Completes, o).unwrap_err().to_string();
    assert!(err.contains("invalid option `interval`"), "{err}");
    assert!(err.contains("minimum of 10ms"), "{err}");
}

#[tokio::test]
async fn a_handler_that_blocks_past_its_runtime_is_reported() {
    struct Blocks;
    impl Handler<DbStore<Job>> for Blocks {
        async fn handle(
            &self,
            _job: &mut DbJob<Job>,
            _ctx: &JobContext<DbStore<Job>>,
        ) -> Result<(), HandlerError> {
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        }
    }
    let db = Db::new().await;
    db.enqueue(1, json!({})).await;
    let store = db.store(Handling::Transactional).await;
    let mut o = worker_options();
    o.num_total_jobs = Some(1);
    o.max_runtime_per_job = Some(Duration::from_millis(50));
    let worker = new_worker(store, Blocks, o).unwrap();
    let mut events = worker.subscribe();
    let run = tokio::spawn(worker.run());
    let ran = workerutil::testing::wait_for(&mut events, |e| match e {
        workerutil::WorkerEvent::Overran { ran, .. } => Some(*ran),
        _ => None,
    })
    .await;
    assert!(ran >= Duration::from_millis(300), "{ran:?}");
    run.await.unwrap();
}
