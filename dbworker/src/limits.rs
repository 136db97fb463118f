//! Global concurrency limits per queue, stored in Postgres and enforced by the
//! claim itself across every worker process.

use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql;

/// The limit table's default name.
pub const DEFAULT_LIMIT_TABLE: &str = "dbworker_limits";

/// What is wrong with the limit table `rel` (missing, or missing columns).
pub(crate) async fn problems(pool: &PgPool, rel: &Relation) -> Result<Vec<String>> {
    crate::schema_check::missing_columns(
        pool,
        rel,
        "limit table",
        &["job_table", "queue", "max_processing"],
        "`dbworker migration --limits` prints it",
    )
    .await
}

/// `CREATE TABLE` for a limit table (`dbworker migration --limits`); one limit
/// table serves every job table.
///
/// ```
/// let ddl = dbworker::limit_table_sql(dbworker::DEFAULT_LIMIT_TABLE).unwrap();
/// assert!(ddl.contains("\"max_processing\" integer NOT NULL"));
/// ```
pub fn limit_table_sql(limit_table: &str) -> Result<String> {
    let rel = Relation::parse("limit_table", limit_table)?;
    let table = rel.quoted();
    Ok(format!(
        r#"-- At most max_processing jobs of a queue processing at once, across every process.
CREATE TABLE IF NOT EXISTS {table} (
    "job_table" text NOT NULL,
    "queue" text NOT NULL,
    "max_processing" integer NOT NULL CHECK ("max_processing" >= 0),
    PRIMARY KEY ("job_table", "queue")
);
"#
    ))
}

/// Sets and removes the global concurrency limits of a job table's queues,
/// for every worker whose store sets `StoreOptions::limit_table`. A new limit
/// applies at the next claim; jobs already processing are not stopped.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let limits = dbworker::Limits::new(&pool, dbworker::DEFAULT_LIMIT_TABLE, "jobs").await?;
/// limits.set("reports", 3).await?; // at most 3 reports processing anywhere
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Limits {
    pool: PgPool,
    limit_table: Relation,
    job_table: String,
}

impl Limits {
    /// Limits of `job_table` (as named in `StoreOptions::table_name`), kept in
    /// `limit_table`, which must exist.
    pub async fn new(pool: &PgPool, limit_table: &str, job_table: &str) -> Result<Limits> {
        let limit_table = Relation::parse("limit_table", limit_table)?;
        let job = Relation::parse("table_name", job_table)?;
        crate::schema_check::none(problems(pool, &limit_table).await?)?;
        Ok(Limits {
            pool: pool.clone(),
            job_table: sql::pause_key(&job),
            limit_table,
        })
    }

    /// Allows at most `max_processing` jobs of `queue` to be processing at once
    /// (0 stops claiming it).
    pub async fn set(&self, queue: &str, max_processing: u32) -> Result<()> {
        let max = i32::try_from(max_processing).map_err(|_| Error::InvalidOption {
            field: "max_processing",
            reason: format!("{max_processing} is too large"),
        })?;
        sql::set_limit(&self.limit_table, &self.job_table, queue, max)
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db("set_limit"))?;
        Ok(())
    }

    /// Removes `queue`'s limit; returns whether it had one.
    pub async fn remove(&self, queue: &str) -> Result<bool> {
        let done = sql::remove_limit(&self.limit_table, &self.job_table, queue)
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db("remove_limit"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The limits in force: `(queue, max_processing)` by queue.
    pub async fn list(&self) -> Result<Vec<(String, u32)>> {
        let rows = sql::list_limits(&self.limit_table, &self.job_table)
            .query()
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("list_limits"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let max: i32 = r.get("max_processing");
                (r.get("queue"), u32::try_from(max).unwrap_or(0))
            })
            .collect())
    }
}
