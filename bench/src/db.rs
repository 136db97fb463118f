//! The server, the scratch database, the job table and `pg_stat_statements`.

use std::fmt;
use std::time::{Duration, Instant};

use dbworker_testkit::{TestDatabase, ThrowawayServer};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::Result;

/// The job table every workload uses (dropped and created again per run).
pub(crate) const TABLE: &str = "bench_jobs";

/// Settings of the throwaway cluster: durable, plus statement counting.
const DURABLE_SETTINGS: [&str; 5] = [
    "fsync=on",
    "synchronous_commit=on",
    "full_page_writes=on",
    "shared_buffers=128MB",
    "shared_preload_libraries=pg_stat_statements",
];

/// Settings printed with every run.
const SHOWN_SETTINGS: [&str; 12] = [
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "shared_buffers",
    "wal_level",
    "wal_buffers",
    "wal_sync_method",
    "commit_delay",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
];

/// The two handling modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// `Handling::Heartbeat`.
    Heartbeat,
    /// `Handling::Transactional`.
    Transactional,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Heartbeat => "heartbeat",
            Mode::Transactional => "transactional",
        })
    }
}

/// Statements executed on the bench database during one run
/// (`pg_stat_statements`, `calls` summed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Statements {
    /// Every statement, BEGIN and COMMIT included.
    pub(crate) all: u64,
    /// Without utility statements (BEGIN, COMMIT, SET, ...).
    pub(crate) non_utility: u64,
    /// WAL the server wrote meanwhile (`pg_current_wal_lsn` moved by this
    /// many bytes: the run's writes, plus whatever else the server did then,
    /// which on the bench's own cluster is little: autovacuum, checkpoints).
    pub(crate) wal_bytes: u64,
}

impl std::ops::Add for Statements {
    type Output = Statements;
    fn add(self, o: Statements) -> Statements {
        Statements {
            all: self.all + o.all,
            non_utility: self.non_utility + o.non_utility,
            wal_bytes: self.wal_bytes + o.wal_bytes,
        }
    }
}

/// The database the benchmark works in, on a throwaway cluster or `DATABASE_URL`.
#[derive(Debug)]
pub(crate) struct Bench {
    // Field order is drop order: the database goes before its server.
    db: TestDatabase,
    admin: PgPool,
    server: Option<ThrowawayServer>,
    /// Why statements cannot be counted, if they cannot.
    statements_unavailable: Option<String>,
    /// The WAL position at the last [`reset_statements`](Self::reset_statements).
    wal_mark: std::sync::Mutex<Option<String>>,
}

impl Bench {
    /// `DATABASE_URL`'s server if set, else a durable throwaway cluster.
    pub(crate) async fn start() -> Result<Bench> {
        let use_url = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
        let server = if use_url {
            None
        } else {
            // initdb and the start block for a second or two.
            let mut settings = DURABLE_SETTINGS.to_vec();
            // The diagnostic that shows the statements triggers run.
            if std::env::var("BENCH_TOP_STATEMENTS").as_deref() == Ok("all") {
                settings.push("pg_stat_statements.track=all");
            }
            Some(tokio::task::spawn_blocking(move || ThrowawayServer::start(&settings)).await??)
        };
        let db = match &server {
            Some(s) => TestDatabase::new_on(s.admin_url()).await?,
            None => TestDatabase::new().await?,
        };
        let admin = db.pool(2).await?;
        let mut bench = Bench {
            db,
            admin,
            server,
            statements_unavailable: None,
            wal_mark: std::sync::Mutex::new(None),
        };
        if let Err(e) = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&bench.admin)
            .await
        {
            bench.statements_unavailable = Some(e.to_string());
        } else if let Err(e) = bench.reset_statements().await {
            // Installed but not preloaded on a DATABASE_URL server.
            bench.statements_unavailable = Some(e.to_string());
        }
        Ok(bench)
    }

    /// The scratch database's URL.
    /// The pool the benchmark itself uses (set-up, counts).
    pub(crate) fn admin(&self) -> &PgPool {
        &self.admin
    }

    pub(crate) fn url(&self) -> &str {
        self.db.url()
    }

    /// A new pool of `max` connections to the scratch database.
    pub(crate) async fn pool(&self, max: u32) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            // The guide's pool advice for workers: no ping before every acquire
            // (a lost connection is handled by the store either way).
            .test_before_acquire(false)
            .connect(self.url())
            .await?)
    }

    /// Where the server comes from, for the report.
    pub(crate) fn origin(&self) -> String {
        match &self.server {
            Some(s) => format!(
                "throwaway cluster started by the benchmark (data in {})",
                s.data_dir().display()
            ),
            None => "DATABASE_URL".to_owned(),
        }
    }

    /// Why statements are not counted, if they are not.
    pub(crate) fn statements_unavailable(&self) -> Option<&str> {
        self.statements_unavailable.as_deref()
    }

    /// `(version, [(setting, value)])`.
    pub(crate) async fn settings(&self) -> Result<(String, Vec<(String, String)>)> {
        let version: String = sqlx::query_scalar("SELECT version()")
            .fetch_one(&self.admin)
            .await?;
        let names: Vec<String> = SHOWN_SETTINGS.iter().map(|s| (*s).to_owned()).collect();
        let settings: Vec<(String, String)> = sqlx::query_as(
            "SELECT n, current_setting(n, true) FROM unnest($1::text[]) WITH ORDINALITY AS s(n, o) ORDER BY o",
        )
        .bind(names)
        .fetch_all(&self.admin)
        .await?;
        Ok((version, settings))
    }

    /// The database clock, as the date of the run.
    pub(crate) async fn now_utc(&self) -> Result<String> {
        Ok(sqlx::query_scalar(
            "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC'",
        )
        .fetch_one(&self.admin)
        .await?)
    }

    /// Clears `pg_stat_statements` (all databases: the counts are read per database).
    /// Also marks the WAL position, from which [`statements`](Self::statements)
    /// counts the bytes written.
    pub(crate) async fn reset_statements(&self) -> Result<()> {
        if self.statements_unavailable.is_none() {
            sqlx::query("SELECT pg_stat_statements_reset()")
                .execute(&self.admin)
                .await?;
        }
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&self.admin)
            .await?;
        *self.wal_mark.lock().unwrap_or_else(|e| e.into_inner()) = Some(lsn);
        Ok(())
    }

    /// Statements run on the bench database since the last reset, leaving out
    /// the benchmark's own statistics queries.
    pub(crate) async fn statements(&self) -> Result<Option<Statements>> {
        if self.statements_unavailable.is_some() {
            return Ok(None);
        }
        let (all, non_utility): (i64, i64) = sqlx::query_as(
            r"SELECT coalesce(sum(calls), 0)::bigint,
                     coalesce(sum(calls) FILTER (WHERE query !~* '^\s*(begin|commit|rollback|start|end|savepoint|release|set|reset|show|discard|listen|unlisten|notify|deallocate)\M'), 0)::bigint
              FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT ILIKE '%pg_stat_statements%'",
        )
        .fetch_one(&self.admin)
        .await?;
        if std::env::var_os("BENCH_TOP_STATEMENTS").is_some() {
            self.print_top_statements().await?;
        }
        let mark = self
            .wal_mark
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or("statements read before any reset")?;
        let wal: i64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint")
                .bind(mark)
                .fetch_one(&self.admin)
                .await?;
        Ok(Some(Statements {
            all: u64::try_from(all)?,
            non_utility: u64::try_from(non_utility)?,
            wal_bytes: u64::try_from(wal)?,
        }))
    }

    /// With `BENCH_TOP_STATEMENTS` set: where the server's time went in this
    /// run, statement by statement (a diagnostic, not part of the report).
    async fn print_top_statements(&self) -> Result<()> {
        // Planning times are zero unless pg_stat_statements.track_planning is on.
        let rows: Vec<(i64, f64, f64, i64, f64, String)> = sqlx::query_as(
            r"SELECT calls, total_exec_time, mean_exec_time, plans, total_plan_time, left(regexp_replace(query, '\s+', ' ', 'g'), 160)
              FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT ILIKE '%pg_stat_statements%'
              ORDER BY total_exec_time DESC LIMIT 12",
        )
        .fetch_all(&self.admin)
        .await?;
        for (calls, total, mean, plans, plan_total, query) in rows {
            eprintln!(
                "  {calls:>8} calls {total:>9.1} ms total {mean:>8.3} ms mean, {plans:>6} plans {plan_total:>7.1} ms  {query}"
            );
        }
        Ok(())
    }

    /// Drops and creates the job table (`dbworker::ddl::job_table_sql`), with
    /// `completed` finished rows in it.
    pub(crate) async fn fresh_table(&self, completed: u64) -> Result<()> {
        let mut ddl = dbworker::ddl::job_table_sql(TABLE, &Default::default())?;
        // The HOT layout (`dbworker migration --hot-layout`): claims are HOT
        // updates; stores find the layout themselves.
        if std::env::var("BENCH_TABLE_LAYOUT").as_deref() == Ok("hot") {
            ddl.push_str(&dbworker::ddl::hot_layout_sql(
                TABLE,
                &Default::default(),
                Default::default(),
            )?);
            // A diagnostic knob: the layout with another fill factor.
            if let Ok(fillfactor) = std::env::var("BENCH_FILLFACTOR") {
                let fillfactor: u32 = fillfactor.parse().map_err(|_| {
                    format!("BENCH_FILLFACTOR={fillfactor}: expected a percentage (10–100)")
                })?;
                ddl.push_str(&format!(
                    "\nALTER TABLE {TABLE} SET (fillfactor = {fillfactor});"
                ));
            }
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {TABLE};\n{ddl}"
        )))
        .execute(&self.admin)
        .await?;
        if completed > 0 {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {TABLE} (state, started_at, finished_at, last_heartbeat_at, worker_hostname) \
                 SELECT 'completed', now(), now(), now(), 'old' FROM generate_series(1, $1::bigint)"
            )))
            .bind(i64::try_from(completed)?)
            .execute(&self.admin)
            .await?;
        }
        Ok(())
    }

    /// Enqueues `jobs` no-op jobs, `batch` rows per statement; returns how long it took.
    pub(crate) async fn enqueue(&self, jobs: u64, batch: u64) -> Result<Duration> {
        let batch = batch.max(1);
        let started = Instant::now();
        let mut left = jobs;
        while left > 0 {
            let n = left.min(batch);
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {TABLE} (queued_at) SELECT now() FROM generate_series(1, $1::bigint)"
            )))
            .bind(i64::try_from(n)?)
            .execute(&self.admin)
            .await?;
            left -= n;
        }
        Ok(started.elapsed())
    }

    /// A fresh table with `completed` old rows and `jobs` queued ones, vacuumed
    /// and analyzed so every run starts from the same state.
    pub(crate) async fn prepare(&self, completed: u64, jobs: u64, batch: u64) -> Result<()> {
        self.fresh_table(completed).await?;
        self.enqueue(jobs, batch).await?;
        self.settle().await
    }

    /// Vacuums, analyzes and checkpoints the job table as it is: the state
    /// every run starts from.
    pub(crate) async fn settle(&self) -> Result<()> {
        sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TABLE}")))
            .execute(&self.admin)
            .await?;
        // Every run starts right after a checkpoint: the one its own WAL
        // triggers (and the full-page images after it) then lands at the
        // same point of each run, not wherever the set-up's WAL left it.
        if let Err(e) = sqlx::raw_sql("CHECKPOINT").execute(&self.admin).await {
            warn_once_no_checkpoint(&e);
        }
        Ok(())
    }

    /// How many jobs the runs completed (the old rows of `fresh_table` left out).
    pub(crate) async fn completed(&self) -> Result<u64> {
        self.count_rows("state = 'completed' AND worker_hostname <> 'old'")
            .await
    }

    /// Rows of this run not completed (`BENCH_FLOOR=lock-delete` deletes
    /// the rows it finishes).
    pub(crate) async fn unfinished(&self) -> Result<u64> {
        self.count_rows("state <> 'completed'").await
    }

    /// Rows of the table matching `condition` (a fixed SQL predicate).
    async fn count_rows(&self, condition: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {TABLE} WHERE {condition}"
        )))
        .fetch_one(&self.admin)
        .await?;
        Ok(u64::try_from(n)?)
    }

    /// Closes the pool; the database and the cluster go when `self` is dropped.
    pub(crate) async fn close(self) {
        self.admin.close().await;
    }
}

/// A server where the bench's role may not run `CHECKPOINT` (PostgreSQL 15
/// needs `pg_checkpoint` or superuser) still runs the bench, saying so once.
fn warn_once_no_checkpoint(e: &sqlx::Error) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| eprintln!("bench: runs do not start after a CHECKPOINT ({e})"));
}
