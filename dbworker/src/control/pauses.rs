//! Durable pause and resume of a job table or one of its queues, stored in
//! Postgres so every worker process honours it at its next claim.

use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::grants::Privilege;
use crate::notify::channel_for;
use crate::sql;
use crate::table::JobTable;

use super::ControlTable;

/// The pause table's default name.
pub const DEFAULT_PAUSE_TABLE: &str = crate::columns::STANDARD_PAUSE_TABLE;

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
/// table sets `JobTableOptions::pause_table`. A pause applies at each worker's
/// next claim (within one poll interval); a resume also notifies the table's
/// channel, so listening workers claim at once.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::control::{Pauses, PausesOptions};
/// let mut options = dbworker::JobTableOptions::detected("email_jobs");
/// options.pause_table = Some(dbworker::control::DEFAULT_PAUSE_TABLE.into());
/// let jobs = dbworker::JobTable::new(&pool, options).await?;
/// let pauses = Pauses::new(&pool, &jobs, PausesOptions::default()).await?;
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

/// How [`Pauses`] wake the workers. Deserializable from a config file.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PausesOptions {
    /// The channel a pause and a resume notify; `None`: the table's default channel
    /// (set it when the store listens on `Listen::Channel`).
    pub notify_channel: Option<String>,
}

impl PausesOptions {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
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
    /// Whether its description of the job table names a queue column (the
    /// dashboard lists queues, with their forms, only then).
    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn has_queues(&self) -> bool {
        self.t.has_queues()
    }

    /// Pauses of `table`, kept in its pause table (`JobTableOptions::pause_table`).
    /// Checks that the role may read it (`SELECT`); a tool that pauses and
    /// resumes checks [`check_writes`](Self::check_writes) too.
    pub async fn new(pool: &PgPool, table: &JobTable, options: PausesOptions) -> Result<Pauses> {
        options.validate()?;
        let t = ControlTable::of(
            pool,
            table,
            table.sql().pause_table.as_ref(),
            "pause_table",
            "--pauses",
        )?;
        t.check("pause table", "reading pauses", &[Privilege::Select])
            .await?;
        Ok(Pauses {
            t,
            channel: options
                .notify_channel
                .unwrap_or_else(|| channel_for(table.relation())),
        })
    }

    /// Checks the grants pausing (`INSERT`) and resuming (`DELETE`) use,
    /// naming each missing one with its `GRANT`.
    pub async fn check_writes(&self) -> Result<()> {
        self.t
            .check(
                "pause table",
                "pausing and resuming",
                &[Privilege::Select, Privilege::Insert, Privilege::Delete],
            )
            .await
    }

    /// Pauses `queue`, or the whole table with `None`; `by` is recorded with
    /// it. Workers claim nothing it pauses from their next claim on, and a
    /// job one of them claimed ahead goes back to the queue when a handler
    /// would start it, instead of starting: a listening worker is told of
    /// the pause by a notification (on `notify_channel`, or the table's
    /// default channel) and checks every job it claimed before; a polling
    /// one checks the jobs that waited a second or more, so one claimed
    /// less than a second before the pause may still start. Returns whether it was not
    /// paused before. Refuses a queue name that is empty, blank or has
    /// whitespace at an end.
    pub async fn pause(&self, queue: Option<&str>, by: &str) -> Result<bool> {
        if let Some(q) = queue {
            super::check_queue_name(q)?;
        }
        let mut tx = self.t.pool.begin().await.map_err(Error::db("begin"))?;
        let row = sql::pause(&self.t.table, &self.t.job_table, key(queue)?, by)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("pause"))?;
        // Delivered when the pause commits: listening workers start none of
        // the jobs they claimed ahead from what it pauses.
        sql::notify_with(&self.channel, crate::notify::PAUSE_PAYLOAD)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("pause"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(row.is_some())
    }

    /// Resumes `queue`, or the whole table with `None`, and wakes listening
    /// workers. Returns whether it was paused.
    pub async fn resume(&self, queue: Option<&str>) -> Result<bool> {
        let mut tx = self.t.pool.begin().await.map_err(Error::db("begin"))?;
        let row = sql::resume(&self.t.table, &self.t.job_table, key(queue)?)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("resume"))?;
        // Delivered when the resume commits.
        sql::notify(&self.channel)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("resume"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(row.is_some())
    }

    /// The pauses in force, the whole table's first.
    pub async fn list(&self) -> Result<Vec<Pause>> {
        let rows = sql::list_pauses(&self.t.table, &self.t.job_table)
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
