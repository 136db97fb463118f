//! Shared set-up for the Postgres integration tests: a fresh database per test
//! and a reference job table with application columns.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbStore, Handling, JobTable, JobTableOptions, RetryPolicy, StoreOptions,
    ddl::{
        OptionalColumns, PartitionInterval, add_jobs_function_sql, admin_functions_sql,
        enqueue_function_sql, job_table_sql, optional_columns_sql, partitioned_job_table_sql,
    },
};
use dbworker_testkit::TestDatabase;
use sqlx::PgPool;
use workerutil::{Record, RecordId};

/// The record the tests' job table yields.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Job {
    pub id: i64,
    pub payload: serde_json::Value,
    pub cost: i32,
}

impl Record for Job {
    fn id(&self) -> RecordId {
        self.id
    }
}

/// A record with its queue, for the tests of named queues and limits.
#[derive(Debug, sqlx::FromRow)]
pub struct QueuedJob {
    pub id: i64,
    pub queue: String,
}

impl Record for QueuedJob {
    fn id(&self) -> RecordId {
        self.id
    }
}

/// A handler that completes every job at once.
pub struct Completes;

impl workerutil::Handler<DbStore<Job>> for Completes {
    async fn handle(
        &self,
        _job: &mut dbworker::DbJob<Job>,
        _ctx: &workerutil::JobContext<DbStore<Job>>,
    ) -> Result<(), workerutil::HandlerError> {
        Ok(())
    }
}

/// A database with a `jobs` table (standard columns plus `payload` and `cost`)
/// and a `side_effects` table handlers write to. Dropping it closes `pool`,
/// then drops the database.
pub struct Db {
    pub db: TestDatabase,
    pub pool: PgPool,
}

impl Drop for Db {
    fn drop(&mut self) {
        // `close` marks the pool closed at once; its future (which waits for
        // the connections in use) cannot be awaited in `drop`. From here on a
        // connection handed back is closed rather than tested with a ping, so
        // none races the forced DROP DATABASE of `self.db`, which runs next
        // and ends the idle ones.
        #[allow(
            clippy::let_underscore_future,
            reason = "marking the pool closed is the point; nothing here can await"
        )]
        let _ = self.pool.close();
    }
}

impl Db {
    pub async fn new() -> Db {
        Db::with_renames(&HashMap::new()).await
    }

    pub async fn with_renames(renames: &HashMap<String, String>) -> Db {
        let db = TestDatabase::new().await.expect("test database");
        Db::set_up(db, renames).await
    }

    /// The test table with every optional column and the SQL functions
    /// (`<table>_enqueue`, `_add_jobs`, the admin functions) installed.
    pub async fn with_sql_functions() -> Db {
        let db = Db::new().await;
        let all = OptionalColumns::all();
        db.add_columns(
            |c| *c = all,
            &[
                enqueue_function_sql("jobs", &HashMap::new(), all).unwrap(),
                add_jobs_function_sql("jobs", &HashMap::new(), all).unwrap(),
                admin_functions_sql("jobs", &HashMap::new(), all).unwrap(),
            ],
        )
        .await;
        db
    }

    /// A database on the server at `admin_url` (a test's own server).
    pub async fn on_server(admin_url: &str) -> Db {
        let db = TestDatabase::new_on(admin_url)
            .await
            .expect("test database");
        Db::set_up(db, &HashMap::new()).await
    }

    /// A database whose `jobs` table is partitioned by day of `queued_at`,
    /// with partitions for the last nine days, today and three days ahead.
    pub async fn partitioned() -> Db {
        let db = TestDatabase::new().await.expect("test database");
        let ddl = partitioned_job_table_sql("jobs", &HashMap::new(), PartitionInterval::Day)
            .unwrap()
            + "SELECT jobs_create_partitions(3, now() - interval '9 days');";
        Db::set_up_with(db, &ddl).await
    }

    /// The test table in the HOT layout (`dbworker::ddl::hot_layout_sql`):
    /// its only index on the state reads the generated `dbworker_live`.
    pub async fn hot() -> Db {
        let db = TestDatabase::new().await.expect("test database");
        let ddl = job_table_sql("jobs", &HashMap::new()).unwrap()
            + &dbworker::ddl::hot_layout_sql("jobs", &HashMap::new(), Default::default()).unwrap();
        Db::set_up_with(db, &ddl).await
    }

    async fn set_up(db: TestDatabase, renames: &HashMap<String, String>) -> Db {
        let ddl = job_table_sql("jobs", renames).unwrap();
        Db::set_up_with(db, &ddl).await
    }

    async fn set_up_with(db: TestDatabase, ddl: &str) -> Db {
        let pool = db.pool(60).await.expect("pool");
        let ddl = ddl.to_owned();
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "ALTER TABLE jobs ADD COLUMN payload jsonb NOT NULL DEFAULT '{}', ADD COLUMN cost integer NOT NULL DEFAULT 0;
             CREATE TABLE side_effects (job_id bigint NOT NULL, note text NOT NULL);",
        )
        .execute(&pool)
        .await
        .unwrap();
        Db { db, pool }
    }

    /// Inserts `n` jobs with the given payload; returns their ids in order.
    pub async fn enqueue(&self, n: usize, payload: serde_json::Value) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "INSERT INTO jobs (payload) SELECT $1 FROM generate_series(1, $2) RETURNING id",
        )
        .bind(payload)
        .bind(n as i64)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut ids: Vec<i64> = rows.into_iter().map(|r| r.0).collect();
        ids.sort_unstable();
        ids
    }

    /// Inserts `n` jobs queued over the last ten days (job `i` queued
    /// `i % 10` days ago), so a partitioned table holds them in ten
    /// partitions; returns their ids in order.
    pub async fn enqueue_spread(&self, n: usize, payload: serde_json::Value) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "INSERT INTO jobs (payload, queued_at)
             SELECT $1, now() - (g % 10) * interval '1 day' FROM generate_series(1, $2) AS g RETURNING id",
        )
        .bind(payload)
        .bind(n as i64)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut ids: Vec<i64> = rows.into_iter().map(|r| r.0).collect();
        ids.sort_unstable();
        ids
    }

    /// How many partitions of `jobs` hold rows (1 for a plain table).
    pub async fn partitions_in_use(&self) -> i64 {
        sqlx::query_scalar("SELECT count(DISTINCT tableoid) FROM jobs")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn state(&self, id: i64) -> String {
        sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Server sessions of this database left idle inside a transaction (a
    /// connection handed back mid-transaction: its later statements never
    /// commit).
    pub async fn sessions_in_transaction(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn scalar<T>(&self, sql: &'static str, id: i64) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        sqlx::query_scalar(sql)
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Waits until no job is pending, queued, errored or processing; panics
    /// after `within`.
    pub async fn wait_until_no_live_job(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let live: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM jobs WHERE state IN ('pending', 'queued', 'errored', 'processing')",
            )
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if live == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let left: Vec<(i64, String, Option<String>)> = sqlx::query_as(
                    "SELECT id, state, to_jsonb(j)::text FROM jobs j \
                     WHERE state IN ('pending', 'queued', 'errored', 'processing') \
                     ORDER BY id LIMIT 20",
                )
                .fetch_all(&self.pool)
                .await
                .unwrap();
                let deps: Option<String> = sqlx::query_scalar(
                    "SELECT CASE WHEN to_regclass('jobs_deps') IS NULL THEN NULL ELSE \
                     query_to_xml('SELECT * FROM jobs_deps', false, false, '')::text END",
                )
                .fetch_one(&self.pool)
                .await
                .unwrap();
                panic!("{live} jobs never finished: {left:#?}\nedges left: {deps:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many execution log entries job `id` has.
    pub async fn log_len(&self, id: i64) -> i32 {
        self.scalar(
            "SELECT coalesce(array_length(execution_logs, 1), 0) FROM jobs WHERE id = $1",
            id,
        )
        .await
    }

    pub async fn count(&self, state: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1")
            .bind(state)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Waits (20 s at most, then fails listing every session) until a
    /// session of this database whose query is `LIKE query` waits for a lock.
    pub async fn await_lock_wait(&self, query: &str, what: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
                 AND wait_event_type = 'Lock' AND query LIKE $1)",
            )
            .bind(query)
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if waiting {
                return;
            }
            if std::time::Instant::now() > deadline {
                let seen: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
                    "SELECT state, wait_event_type, query FROM pg_stat_activity WHERE datname = current_database()",
                )
                .fetch_all(&self.pool)
                .await
                .unwrap();
                panic!("{what}: {seen:#?}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Makes every processing job look stalled.
    pub async fn age_heartbeats(&self) {
        sqlx::query("UPDATE jobs SET last_heartbeat_at = now() - interval '1 hour' WHERE state = 'processing'")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// Runs the ignored test `child` (its full name, [`test_path`]) of this
    /// test binary as a worker process
    /// (`env` names the variable that hands it this database's URL), SIGKILLs
    /// it once `completed` jobs have completed, and returns how many jobs it
    /// left `processing`, asserting that there are some.
    pub async fn kill_worker_process(&self, child: &str, env: &str, completed: i64) -> i64 {
        use std::process::{Command, Stdio};
        let url = self.killed_child_url();
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", child, "--ignored", "--nocapture"])
            .env(env, &url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.count("completed").await < completed {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the child made no progress"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        process.kill().unwrap(); // SIGKILL
        process.wait().unwrap();
        self.wait_for_killed_child_backends().await;
        let stranded = self.count("processing").await;
        assert!(stranded > 0, "the kill left claimed jobs behind");
        stranded
    }

    /// The test database's URL for a child process the test will kill: its
    /// connections carry a name, so [`Self::wait_for_killed_child_backends`]
    /// can wait for the server to finish what they were running.
    pub fn killed_child_url(&self) -> String {
        let url = self.db.url();
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}application_name=dbworker_killed_child")
    }

    /// Waits until the backends of a killed child (connected with
    /// `application_name=dbworker_killed_child`) are gone: a statement it had
    /// sent still runs to its end (a claim in flight commits after the kill).
    pub async fn wait_for_killed_child_backends(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbworker_killed_child'",
            )
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if left == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the killed child's backends never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A transaction on the pool that began 1.5 s ago, and the clock now
    /// (seconds since the epoch): for statements that must stamp the clock,
    /// not the start of a caller's long transaction.
    pub async fn long_transaction(&self) -> (sqlx::Transaction<'static, sqlx::Postgres>, f64) {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("SELECT pg_sleep(1.5)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let now: f64 = sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        (tx, now)
    }

    /// Runs `act` while a transaction that updated jobs `ids` (as a
    /// heartbeat or an application's write does) holds their row locks for
    /// 1.5 s (`act` must wait for them), then commits; `act`'s output and
    /// the clock at the commit (seconds since the epoch): for statements
    /// that must stamp the time they wrote a row, not the time they began.
    /// (Postgres computes an UPDATE's new values before it waits for a row's
    /// lock, and again after it only if the holder changed the row.)
    pub async fn after_row_locks<T: Send + 'static>(
        &self,
        ids: &[i64],
        act: impl Future<Output = T> + Send + 'static,
    ) -> (T, f64) {
        let mut lock = self.pool.begin().await.unwrap();
        sqlx::query("UPDATE jobs SET num_failures = num_failures WHERE id = ANY($1)")
            .bind(ids)
            .execute(&mut *lock)
            .await
            .unwrap();
        let acting = tokio::spawn(act);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!acting.is_finished(), "it did not wait for the row locks");
        let released: f64 =
            sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
                .fetch_one(&mut *lock)
                .await
                .unwrap();
        lock.commit().await.unwrap();
        (acting.await.unwrap(), released)
    }

    /// Job `id`'s `finished_at`, in seconds since the epoch.
    pub async fn finished_at(&self, id: i64) -> f64 {
        self.scalar(
            "SELECT EXTRACT(EPOCH FROM finished_at)::float8 FROM jobs WHERE id = $1",
            id,
        )
        .await
    }

    /// Runs DDL (or any statements) on the test database.
    pub async fn execute(&self, ddl: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.to_owned()))
            .execute(&self.pool)
            .await
            .expect("DDL");
    }

    /// Adds the optional columns `set` turns on to `jobs`, and runs `extra` DDL.
    pub async fn add_columns(&self, set: impl FnOnce(&mut OptionalColumns), extra: &[String]) {
        let mut columns = OptionalColumns::default();
        set(&mut columns);
        let mut ddl = optional_columns_sql("jobs", &HashMap::new(), columns).unwrap();
        for more in extra {
            ddl.push_str(more);
        }
        self.execute(&ddl).await;
    }

    /// The description of the test table, `jobs j`, with no optional column.
    pub fn table_options() -> JobTableOptions {
        JobTableOptions::new("jobs j")
    }

    /// The test table, checked, as every service takes it.
    pub async fn table(&self) -> JobTable {
        self.table_with(|_| {}).await
    }

    /// The test table with what `set` adds to its description.
    pub async fn table_with(&self, set: impl FnOnce(&mut JobTableOptions)) -> JobTable {
        let mut o = Db::table_options();
        set(&mut o);
        JobTable::new(&self.pool, o).await.expect("job table")
    }

    pub fn options(&self) -> StoreOptions {
        Db::options_for_tests()
    }

    pub fn options_for_tests() -> StoreOptions {
        let mut o = StoreOptions::new("test_store");
        // Tests opt into retries where they test them, so one error is final here.
        o.max_num_retries = 0;
        o.retry = RetryPolicy::fixed(Duration::ZERO);
        o.stall.stalled_max_age = Duration::from_secs(5);
        o
    }

    pub async fn store(&self, handling: Handling) -> Arc<DbStore<Job>> {
        let mut o = self.options();
        o.handling = handling;
        self.store_on(&self.table().await, o).await
    }

    /// A store over `table` with `options`.
    pub async fn store_on(&self, table: &JobTable, options: StoreOptions) -> Arc<DbStore<Job>> {
        Arc::new(
            DbStore::new(&self.pool, table, options)
                .await
                .expect("store"),
        )
    }
}

/// The name libtest gives the test function `name` of the module whose
/// `module_path!()` is `module`, as `--exact` wants it: the module path
/// without the crate's name (`crash::crash_child_grouped_worker` in the
/// binary `faults`). A test re-running its own binary as a child names the
/// child this way, so the name holds wherever the file's module sits.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// Log lines a test's subscriber writes, to read back (`tracing_subscriber`'s
/// `with_writer(move || lines.clone())`).
#[derive(Clone, Default)]
pub struct LogLines(Arc<std::sync::Mutex<Vec<u8>>>);

impl LogLines {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.lines()).into_owned()
    }

    /// Forgets what was written so far.
    pub fn clear(&self) {
        self.lines().clear();
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::io::Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lines().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits up to `within` for a wake-up, and asserts it came once a job that
/// was, at `scheduled`, one second from due had come due: the claim cursor's
/// probe found it (nothing announces a job coming due).
pub async fn woken_once_due(
    wakeups: &mut workerutil::Wakeups,
    scheduled: std::time::Instant,
    within: Duration,
) {
    let woken = tokio::time::timeout(within, wakeups.woken()).await;
    let took = scheduled.elapsed();
    assert!(
        woken.is_ok() && took >= Duration::from_millis(900),
        "the job came due after 1 s; woken: {}, after {took:?}",
        woken.is_ok()
    );
}

/// The jobs a worker reported finished so far, in order: each outcome's
/// kind and whether the store took its mark.
pub fn finished_so_far(
    events: &mut tokio::sync::broadcast::Receiver<workerutil::WorkerEvent>,
) -> Vec<(&'static str, bool)> {
    let mut reported = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let workerutil::WorkerEvent::JobFinished {
            outcome, marked, ..
        } = event
        {
            reported.push((outcome.kind(), marked));
        }
    }
    reported
}
