//! Operator actions on a job table, for the `dbworker` command line and for
//! applications' own admin tools: status, one job's row, and the single-job
//! actions (requeue, cancel, fail, delete). Every action names the states it
//! may act on, so it never overwrites a job a worker holds.

use std::collections::HashMap;

use sqlx::{PgPool, Row};
use workerutil::JobState;

use crate::columns::{Columns, Relation};
use crate::error::{Error, Result};
use crate::sql;

/// A job table as an operator sees it.
#[derive(Debug, Clone)]
pub struct Admin {
    pool: PgPool,
    pub(crate) table: Relation,
    pub(crate) columns: Columns,
    pub(crate) queue_column: Option<String>,
}

/// What [`Admin::status`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Status {
    /// Live jobs per state and queue: `(state, queue, count)`.
    pub live: Vec<(JobState, Option<String>, u64)>,
    /// Seconds the oldest waiting job has waited (database clock).
    pub oldest_waiting_seconds: f64,
    /// Processing jobs per worker host.
    pub processing_by_host: Vec<(String, u64)>,
    /// Rows in the table, as the planner estimates them (no full count).
    pub estimated_rows: i64,
}

/// What [`Admin::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Canceled {
    /// A waiting job is now `canceled`.
    Now,
    /// A processing job was asked to stop: its worker sees `cancel = true` at
    /// its next heartbeat and records it `canceled`.
    Requested,
    /// No live job with that id.
    NotLive,
}

impl Admin {
    /// The table `table_name` (with standard columns renamed as given, and the
    /// queue column if any), checked now.
    pub async fn new(
        pool: &PgPool,
        table_name: &str,
        alternate_column_names: &HashMap<String, String>,
        queue_column: Option<&str>,
    ) -> Result<Admin> {
        let table = Relation::parse("table_name", table_name)?;
        let columns = Columns::resolve(alternate_column_names)?;
        let mut problems = Vec::new();
        crate::schema_check::check_table(pool, &table, &columns, &mut problems).await?;
        crate::schema_check::none(problems)?;
        Ok(Admin {
            pool: pool.clone(),
            table,
            columns,
            queue_column: queue_column.map(str::to_owned),
        })
    }

    /// Live jobs per state and queue, the oldest wait, who is processing, and
    /// the table's estimated size; each bounded by the partial indexes.
    pub async fn status(&self) -> Result<Status> {
        let db = Error::db("status");
        let live = sql::admin_live(self)
            .query()
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        let mut status = Status::default();
        for row in live {
            let state: String = row.get("state");
            let Ok(state) = state.parse::<JobState>() else {
                continue;
            };
            let count = u64::try_from(row.get::<i64, _>("count")).unwrap_or(0);
            if matches!(state, JobState::Queued | JobState::Errored) {
                status.oldest_waiting_seconds = status
                    .oldest_waiting_seconds
                    .max(row.get::<f64, _>("oldest"));
            }
            status.live.push((state, row.get("queue"), count));
        }
        let hosts = sql::admin_hosts(self)
            .query()
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("status"))?;
        status.processing_by_host = hosts
            .iter()
            .map(|r| {
                let n: i64 = r.get("count");
                (r.get("host"), u64::try_from(n).unwrap_or(0))
            })
            .collect();
        status.estimated_rows = sql::admin_estimate(self)
            .query()
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("status"))?
            .get("rows");
        Ok(status)
    }

    /// The job's row as JSON (every column), or `None`.
    pub async fn show(&self, id: i64) -> Result<Option<serde_json::Value>> {
        let row = sql::admin_show(self, id)
            .query()
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("show"))?;
        Ok(row.map(|r| r.get("row")))
    }

    /// Puts a failed, canceled or errored job back in the queue, to run now;
    /// its failure count starts again. Returns whether it did.
    pub async fn requeue(&self, id: i64) -> Result<bool> {
        self.act(sql::admin_requeue(self, id), "requeue").await
    }

    /// Cancels a job: a waiting one at once, a processing one through its worker.
    pub async fn cancel(&self, id: i64) -> Result<Canceled> {
        if self
            .act(sql::admin_cancel_waiting(self, id), "cancel")
            .await?
        {
            return Ok(Canceled::Now);
        }
        if self
            .act(sql::admin_request_cancel(self, id), "cancel")
            .await?
        {
            return Ok(Canceled::Requested);
        }
        Ok(Canceled::NotLive)
    }

    /// Fails a waiting (queued or errored) job with `message`. Returns whether it did.
    pub async fn fail(&self, id: i64, message: &str) -> Result<bool> {
        self.act(sql::admin_fail(self, id, message), "fail").await
    }

    /// Deletes a job that is not processing. Returns whether it did.
    pub async fn delete(&self, id: i64) -> Result<bool> {
        self.act(sql::admin_delete(self, id), "delete").await
    }

    async fn act(&self, statement: sql::Statement, op: &'static str) -> Result<bool> {
        let done = statement
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db(op))?;
        Ok(done.rows_affected() == 1)
    }
}
