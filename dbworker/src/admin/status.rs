//! [`Admin::status`]: every state counted per queue and in total, without a
//! sequential scan of the table. Live states (pending, scheduled, available,
//! processing, stalled, errored) are exact through the partial indexes every
//! job table has; finished states (completed, failed, canceled) and the
//! failures of the last hour are exact when an index over the final states
//! serves them (the retention index, `dbworker migration --retention`), and
//! otherwise the finished states are the planner's estimate, in total only,
//! or, with [`Admin::status_with_history`], the job history's sums per queue.

use std::time::Duration;

use sqlx::{PgConnection, Row};
use workerutil::JobState;

use super::Admin;
use crate::error::{Error, Result};
use crate::sql;
use crate::store::StallOptions;

/// The window of [`QueueCounts::failed_last_hour`].
const RECENT: Duration = Duration::from_secs(3600);

/// What [`Admin::status`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Status {
    /// Live jobs per state and queue: `(state, queue, count)` (pending,
    /// queued, errored, processing).
    pub live: Vec<(JobState, Option<String>, u64)>,
    /// Seconds the longest-waiting due job has been runnable: since it was
    /// queued or, when later, since its `process_after` (a requeued job
    /// counts from its requeue), by the database clock.
    pub oldest_waiting_seconds: f64,
    /// Processing jobs per worker host.
    pub processing_by_host: Vec<(String, u64)>,
    /// Rows in the table, as the planner estimates them (no full count); on
    /// a partitioned table, summed over its partitions.
    pub estimated_rows: i64,
    /// Every state per queue, by queue name (`None`: the table has no queue
    /// column); a queue with only finished jobs appears when they are exact.
    pub queues: Vec<QueueCounts>,
    /// The sum over the queues. With [`FinishedCounts::Estimated`], its
    /// finished states are the planner's estimates.
    pub total: QueueCounts,
    /// How the finished states were counted.
    pub finished: FinishedCounts,
    /// A processing job whose heartbeat is older than this counts as stalled.
    pub stalled_age: Duration,
}

/// How [`Admin::status`] counted the finished states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishedCounts {
    /// Counted exactly, through an index over the final states.
    Exact,
    /// No index serves them: [`Status::total`] holds the planner's estimate
    /// per state, and each queue `None`; the failures of the last hour are
    /// unknown.
    #[default]
    Estimated,
    /// No index serves them, but the job history
    /// ([`History`](crate::history::History)) records them: the counts per
    /// queue and in total are the jobs finished over the period it keeps
    /// (`covered`: from its oldest row to now), not every finished row of
    /// the table; the failures of the last hour are unknown.
    FromHistory {
        /// From the history's oldest row to now (database clock).
        covered: Duration,
    },
}

impl Status {
    /// Every state per queue, by queue name (the same as [`Status::queues`]).
    pub fn per_queue(&self) -> Vec<QueueCounts> {
        self.queues.clone()
    }
}

/// One queue's jobs in every state, from [`Status::queues`].
///
/// `scheduled`, `available` and `errored` overlap: an errored job whose retry
/// delay has passed is both `errored` and `available`; `queued` is every
/// queued job, scheduled or due. `stalled` is part of `processing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct QueueCounts {
    /// The queue; `None` when the table has no queue column, for its jobs
    /// whose queue is NULL, or in [`Status::total`].
    pub queue: Option<String>,
    /// Jobs waiting to run (`queued`), due or scheduled.
    pub queued: u64,
    /// Jobs waiting for a retry (`errored`), due or not.
    pub errored: u64,
    /// Jobs a worker holds (`processing`), stalled ones included.
    pub processing: u64,
    /// Workflow jobs waiting for the jobs they depend on (`pending`).
    pub pending: u64,
    /// Queued jobs whose run-at (`process_after`) is still ahead.
    pub scheduled: u64,
    /// Queued or errored jobs due now: what the next claims take.
    pub available: u64,
    /// Processing jobs whose heartbeat is older than [`Status::stalled_age`].
    pub stalled: u64,
    /// Completed jobs (`None`: not counted exactly, see [`FinishedCounts`]).
    pub completed: Option<u64>,
    /// Failed jobs.
    pub failed: Option<u64>,
    /// Canceled jobs.
    pub canceled: Option<u64>,
    /// Jobs failed (for good) in the last hour.
    pub failed_last_hour: Option<u64>,
}

/// The counted states in the order an operator reads them: the headings of
/// `dbworker status` and of the dashboard's overview, one per value of
/// [`QueueCounts::in_columns`].
pub const STATE_COLUMNS: [&str; 10] = [
    "pending",
    "scheduled",
    "available",
    "errored",
    "processing",
    "stalled",
    "completed",
    "failed",
    "canceled",
    "failed/1h",
];

impl QueueCounts {
    /// The counts in the order of [`STATE_COLUMNS`]; `None` where a finished
    /// state was not counted exactly.
    pub fn in_columns(&self) -> [Option<u64>; 10] {
        [
            Some(self.pending),
            Some(self.scheduled),
            Some(self.available),
            Some(self.errored),
            Some(self.processing),
            Some(self.stalled),
            self.completed,
            self.failed,
            self.canceled,
            self.failed_last_hour,
        ]
    }

    /// A queue with no job.
    pub(crate) fn idle(queue: Option<String>) -> QueueCounts {
        QueueCounts {
            queue,
            ..QueueCounts::default()
        }
    }

    /// Adds `other`'s counts to these.
    fn add(&mut self, o: &QueueCounts) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.queued += o.queued;
        self.errored += o.errored;
        self.processing += o.processing;
        self.pending += o.pending;
        self.scheduled += o.scheduled;
        self.available += o.available;
        self.stalled += o.stalled;
        self.completed = sum(self.completed, o.completed);
        self.failed = sum(self.failed, o.failed);
        self.canceled = sum(self.canceled, o.canceled);
        self.failed_last_hour = sum(self.failed_last_hour, o.failed_last_hour);
    }
}

/// The row of `queue` in `rows`, added when missing.
fn entry(rows: &mut Vec<QueueCounts>, queue: Option<String>) -> &mut QueueCounts {
    let i = match rows.iter().position(|r| r.queue == queue) {
        Some(i) => i,
        None => {
            rows.push(QueueCounts::idle(queue));
            rows.len() - 1
        }
    };
    &mut rows[i]
}

fn count(row: &sqlx::postgres::PgRow, column: &str) -> u64 {
    u64::try_from(row.get::<i64, _>(column)).unwrap_or(0)
}

/// Whether a JSON plan (`EXPLAIN (FORMAT JSON)`) scans a table sequentially.
fn scans_sequentially(plan: &serde_json::Value) -> bool {
    match plan {
        serde_json::Value::Object(node) => node.iter().any(|(key, value)| {
            (key == "Node Type" && value == "Seq Scan") || scans_sequentially(value)
        }),
        serde_json::Value::Array(items) => items.iter().any(scans_sequentially),
        _ => false,
    }
}

impl Admin {
    /// Every state per queue and in total, the oldest wait, who is
    /// processing, and the table's estimated size; never a sequential scan
    /// of the table (see [`Status`]). Stalled: a heartbeat older than the
    /// resetter's default stalled age (30 s); [`Admin::status_with`] takes
    /// another.
    pub async fn status(&self) -> Result<Status> {
        self.status_with(StallOptions::default().stalled_max_age)
            .await
    }

    /// [`Admin::status`], a processing job counted as stalled once its
    /// heartbeat is older than `stalled_age`.
    pub async fn status_with(&self, stalled_age: Duration) -> Result<Status> {
        let db = || Error::db("status");
        // One transaction, the planner told to avoid sequential scans: each
        // statement takes an index wherever one serves.
        let mut tx = sql::begin_index_only(&self.pool).await.map_err(db())?;
        let status = self.counts(&mut tx, stalled_age).await?;
        tx.commit().await.map_err(db())?;
        Ok(status)
    }

    /// [`Admin::status_with`], the finished states read from the job history
    /// in `history_table` (see [`crate::history`]) when no index serves an
    /// exact count and the history holds rows for this table
    /// ([`FinishedCounts::FromHistory`]); otherwise as
    /// [`Admin::status_with`] (a missing history table is no error).
    pub async fn status_with_history(
        &self,
        stalled_age: Duration,
        history_table: &str,
    ) -> Result<Status> {
        let mut status = self.status_with(stalled_age).await?;
        if status.finished != FinishedCounts::Estimated {
            return Ok(status);
        }
        let db = || Error::db("status from the history");
        let h = crate::columns::Relation::parse("history_table", history_table)?;
        let exists: bool = sql::history_clock(&h)
            .fetch_one(&self.pool)
            .await
            .map_err(db())?
            .get("exists");
        if !exists {
            return Ok(status);
        }
        let rows = sql::history_finished(&h, &self.t.table.display_name())
            .fetch_all(&self.pool)
            .await
            .map_err(db())?;
        if rows.is_empty() {
            return Ok(status);
        }
        let mut covered = 0.0_f64;
        for q in &mut status.queues {
            (q.completed, q.failed, q.canceled) = (Some(0), Some(0), Some(0));
        }
        for row in &rows {
            let queue: String = row.get("queue");
            let q = entry(&mut status.queues, (!queue.is_empty()).then_some(queue));
            let n = |c: &str| Some(count(row, c));
            (q.completed, q.failed, q.canceled) = (n("completed"), n("failed"), n("canceled"));
            covered = covered.max(row.get::<Option<f64>, _>("covered").unwrap_or(0.0));
        }
        status.queues.sort();
        let mut total = QueueCounts::default();
        for q in &status.queues {
            total.add(q);
        }
        status.total = total;
        status.finished = FinishedCounts::FromHistory {
            covered: Duration::try_from_secs_f64(covered).unwrap_or_default(),
        };
        Ok(status)
    }

    async fn counts(&self, conn: &mut PgConnection, stalled_age: Duration) -> Result<Status> {
        let db = || Error::db("status");
        let mut status = Status {
            stalled_age,
            ..Status::default()
        };
        let mut queues: Vec<QueueCounts> = Vec::new();
        let live = sql::counts_live(&self.t, stalled_age)
            .fetch_all(&mut *conn)
            .await
            .map_err(db())?;
        for row in live {
            let Ok(state) = row.get::<String, _>("state").parse::<JobState>() else {
                continue;
            };
            let queue: Option<String> = row.get("queue");
            let (n, later) = (count(&row, "count"), count(&row, "later"));
            let q = entry(&mut queues, queue.clone());
            match state {
                JobState::Pending => q.pending += n,
                JobState::Queued => {
                    q.queued += n;
                    q.scheduled += later;
                    q.available += n - later;
                }
                JobState::Errored => {
                    q.errored += n;
                    q.available += n - later;
                }
                JobState::Processing => {
                    q.processing += n;
                    q.stalled += count(&row, "stalled");
                }
                _ => {}
            }
            if matches!(state, JobState::Queued | JobState::Errored) {
                status.oldest_waiting_seconds = status
                    .oldest_waiting_seconds
                    .max(row.get::<f64, _>("oldest"));
            }
            status.live.push((state, queue, n));
        }
        let plan: serde_json::Value = sql::counts_explain(sql::counts_finished(&self.t, RECENT))
            .fetch_one(&mut *conn)
            .await
            .map_err(db())?
            .get(0);
        let mut total = QueueCounts::default();
        if scans_sequentially(&plan) {
            status.finished = FinishedCounts::Estimated;
            for state in [JobState::Completed, JobState::Failed, JobState::Canceled] {
                let plan: serde_json::Value = sql::counts_estimate(&self.t, state)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db())?
                    .get(0);
                let rows = plan[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0);
                // A row estimate: a float, never negative, far below u64::MAX.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let rows = Some(rows.max(0.0).round() as u64);
                match state {
                    JobState::Completed => total.completed = rows,
                    JobState::Failed => total.failed = rows,
                    _ => total.canceled = rows,
                }
            }
        } else {
            status.finished = FinishedCounts::Exact;
            for q in &mut queues {
                (q.completed, q.failed, q.canceled, q.failed_last_hour) =
                    (Some(0), Some(0), Some(0), Some(0));
            }
            let rows = sql::counts_finished(&self.t, RECENT)
                .fetch_all(&mut *conn)
                .await
                .map_err(db())?;
            for row in rows {
                let q = entry(&mut queues, row.get("queue"));
                let n = Some(count(&row, "count"));
                match row.get::<String, _>("state").as_str() {
                    "completed" => q.completed = n,
                    "failed" => q.failed = n,
                    _ => q.canceled = n,
                }
                let recent = count(&row, "failed_recently");
                q.failed_last_hour = Some(q.failed_last_hour.unwrap_or(0) + recent);
                for field in [&mut q.completed, &mut q.failed, &mut q.canceled] {
                    field.get_or_insert(0);
                }
            }
        }
        queues.sort();
        for q in &queues {
            total.add(q);
        }
        status.queues = queues;
        status.total = total;
        let hosts = sql::admin_hosts(&self.t)
            .fetch_all(&mut *conn)
            .await
            .map_err(db())?;
        status.processing_by_host = hosts
            .iter()
            .map(|r| (r.get("host"), count(r, "count")))
            .collect();
        status.estimated_rows = sql::admin_estimate(&self.t)
            .fetch_one(&mut *conn)
            .await
            .map_err(db())?
            .get("rows");
        Ok(status)
    }
}
