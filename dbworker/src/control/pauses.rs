//! Durable pause and resume of a job table or one of its queues, stored in
//! Postgres so every worker process honours it at its next claim.

use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::notify::channel_for;
use crate::sql;

use super::ControlTable;

/// The pause table's default name.
pub const DEFAULT_PAUSE_TABLE: &str = "dbworker_pauses";

/// What pausing the whole table is recorded as (a queue can never be named so
/// in [`Pauses::pause`]).
const WHOLE_TABLE: &str = "*";

/// A pause in force.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Pause {
    /// The paused queue; `None`: the whole table.
    pub queue: Option<String>,
    /// Who paused it, as given to [`Pauses::pause`].
    pub paused_by: String,
    /// How long it has been paused, by the database clock, in seconds.
    pub seconds: f64,
}

/// Pauses and resumes a job table, or queues in it, for every worker whose
/// store sets `StoreOptions::pause_table`. A pause applies at each worker's
/// next claim (within one poll interval); a resume also notifies the table's
/// channel, so listening workers claim at once.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let pauses = dbworker::control::Pauses::new(&pool, dbworker::control::PausesOptions::new("email_jobs")).await?;
/// pauses.pause(Some("newsletters"), "ops: provider outage").await?;
/// // ... later, from any process:
/// pauses.resume(Some("newsletters")).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pauses {
    t: ControlTable,
    /// Where a resume wakes the workers.
    channel: String,
}

/// Which job table [`Pauses`] pauses, and where the pauses are kept.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PausesOptions {
    /// The job table, as named in `StoreOptions::table_name`. Required.
    pub job_table: String,
    /// The pause table (it must exist). Default [`DEFAULT_PAUSE_TABLE`].
    pub pause_table: String,
    /// The channel a resume notifies; `None`: the table's default channel
    /// (set it when the store listens on `Listen::Channel`).
    pub notify_channel: Option<String>,
}

impl PausesOptions {
    /// Pauses of `job_table`, kept in the default pause table.
    pub fn new(job_table: impl Into<String>) -> PausesOptions {
        PausesOptions {
            job_table: job_table.into(),
            pause_table: DEFAULT_PAUSE_TABLE.to_owned(),
            notify_channel: None,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        Relation::parse("job_table", &self.job_table)?;
        Relation::parse("pause_table", &self.pause_table)?;
        if let Some(channel) = &self.notify_channel
            && !crate::columns::is_identifier(channel)
        {
            return Err(Error::InvalidOption {
                field: "notify_channel",
                reason: format!("{channel:?} is not a plain identifier"),
            });
        }
        Ok(())
    }
}

impl Pauses {
    /// Pauses of `options.job_table`, kept in `options.pause_table`, which
    /// must exist.
    pub async fn new(pool: &PgPool, options: PausesOptions) -> Result<Pauses> {
        options.validate()?;
        let job = Relation::parse("job_table", &options.job_table)?;
        let t =
            ControlTable::open(
                pool,
                "pause_table",
                &options.pause_table,
                &job,
                |pool, table| async move {
                    crate::schema_check::pause_table_problems(&pool, &table).await
                },
            )
            .await?;
        Ok(Pauses {
            t,
            channel: options.notify_channel.unwrap_or_else(|| channel_for(&job)),
        })
    }

    /// Pauses `queue`, or the whole table with `None`; `by` is recorded with
    /// it. Returns whether it was not paused before.
    pub async fn pause(&self, queue: Option<&str>, by: &str) -> Result<bool> {
        let row = sql::pause(&self.t.table, &self.t.job_table, key(queue)?, by)
            .query()
            .fetch_optional(&self.t.pool)
            .await
            .map_err(Error::db("pause"))?;
        Ok(row.is_some())
    }

    /// Resumes `queue`, or the whole table with `None`, and wakes listening
    /// workers. Returns whether it was paused.
    pub async fn resume(&self, queue: Option<&str>) -> Result<bool> {
        let mut tx = self.t.pool.begin().await.map_err(Error::db("begin"))?;
        let row = sql::resume(&self.t.table, &self.t.job_table, key(queue)?)
            .query()
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("resume"))?;
        // Delivered when the resume commits.
        sql::notify(&self.channel)
            .query()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("resume"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(row.is_some())
    }

    /// The pauses in force, the whole table's first.
    pub async fn list(&self) -> Result<Vec<Pause>> {
        let rows = sql::list_pauses(&self.t.table, &self.t.job_table)
            .query()
            .fetch_all(&self.t.pool)
            .await
            .map_err(Error::db("list_pauses"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let queue: String = r.get("queue");
                Pause {
                    queue: (queue != WHOLE_TABLE).then_some(queue),
                    paused_by: r.get("paused_by"),
                    seconds: r.get("seconds"),
                }
            })
            .collect())
    }
}

fn key(queue: Option<&str>) -> Result<&str> {
    match queue {
        None => Ok(WHOLE_TABLE),
        Some(WHOLE_TABLE) => Err(Error::InvalidOption {
            field: "queue",
            reason: "`*` stands for the whole table; pass None".into(),
        }),
        Some(q) => Ok(q),
    }
}
