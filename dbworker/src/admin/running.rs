//! The jobs running now, longest first, with the progress their handlers
//! report (`dbworker migration --progress`): what `dbworker top` lists.

use std::time::Duration;

use sqlx::Row;

use super::Admin;
use crate::error::{Error, Result};
use crate::sql;

/// One processing job ([`Admin::running`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RunningJob {
    /// The job's id.
    pub id: i64,
    /// The worker that claimed it.
    pub worker_hostname: String,
    /// How long it has been running (database clock).
    pub running_for: Duration,
    /// Its public progress, as its handler last set it (`None`: none yet, or
    /// a table that keeps no progress), from the table's column or its side
    /// table.
    pub progress: Option<serde_json::Value>,
}

impl Admin {
    /// The `limit` longest-running processing jobs, oldest start first,
    /// with their progress when the table keeps it, in its column or in its
    /// side table ([`JobTable::has_progress`](crate::JobTable::has_progress)).
    pub async fn running(&self, limit: u32) -> Result<Vec<RunningJob>> {
        let rows = sql::running_jobs(&self.t, u64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("running"))?;
        Ok(rows
            .iter()
            .map(|r| RunningJob {
                id: r.get("id"),
                worker_hostname: r.get::<Option<String>, _>("host").unwrap_or_default(),
                // A claim's start a little ahead of now (clock steps) is 0.
                running_for: r
                    .get::<Option<f64>, _>("running_for")
                    .and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
                    .unwrap_or_default(),
                progress: r.get("progress"),
            })
            .collect())
    }

    /// Whether the table keeps its jobs' progress (`dbworker migration
    /// --progress`, or its side table: `--progress-table`).
    pub fn has_progress(&self) -> bool {
        self.t.keeps_progress()
    }
}
