//! The job history: finished jobs per job table, queue and minute (completed,
//! failed, canceled, retried, wait and run times), kept for days in a small
//! table (`dbworker migration --history`), read by the dashboard's charts and
//! `dbworker top`.
//!
#![doc = include_str!("../../docs/modules/history.md")]

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::runner::{Next, Pass, Runner};
use crate::sql::{self, Table};
use crate::table::JobTable;

mod read;

pub use read::{Point, QueueHistory, Range, Series, by_queue, series};

/// The history table `dbworker migration --history` creates.
pub const DEFAULT_HISTORY_TABLE: &str = "dbworker_history";

/// The history table's columns, checked by [`History::new`].
const COLUMNS: [&str; 17] = [
    "job_table",
    "queue",
    "bucket",
    "seconds",
    "completed",
    "failed",
    "canceled",
    "retried",
    "timed",
    "wait_p50",
    "wait_p95",
    "wait_max",
    "wait_sum",
    "run_p50",
    "run_p95",
    "run_max",
    "run_sum",
];

/// How [`History`] records, downsamples and keeps a job table's history.
///
/// Deserializable from a config file: every field left out keeps its
/// default, durations are written as in [`workerutil::duration`] (`"14d"`),
/// and an unknown field is refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HistoryOptions {
    /// The history table, shared by every job table. Default
    /// [`DEFAULT_HISTORY_TABLE`].
    pub history_table: String,
    /// Time between passes, spread by ±10 %. Default 30 s.
    #[serde(with = "workerutil::duration")]
    pub interval: Duration,
    /// How long after a minute ends it is recorded. A job's `finished_at` is
    /// set when it is marked, and its transaction may commit a little later:
    /// a job committed more than `settle` after its minute ended is not
    /// counted. Default 1 min.
    #[serde(with = "workerutil::duration")]
    pub settle: Duration,
    /// How far back a pass looks for minutes not yet recorded (after a
    /// stop, a first start): older minutes are left unrecorded. At least
    /// 1 min. Default 6 h.
    #[serde(with = "workerutil::duration")]
    pub catch_up: Duration,
    /// Minute rows of hours that ended longer ago than this become one row
    /// per hour: counts, sums and maxima exact, percentiles approximated
    /// (the minutes' own, weighted by their jobs). At least `catch_up` +
    /// `settle` + 1 h, so no minute is recorded after its hour was
    /// downsampled. Default 1 day.
    #[serde(with = "workerutil::duration")]
    pub downsample_after: Duration,
    /// Rows older than this are deleted. At least 1 h. Default 14 days.
    #[serde(with = "workerutil::duration")]
    pub keep: Duration,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        const HOUR: u64 = 3600;
        HistoryOptions {
            history_table: DEFAULT_HISTORY_TABLE.to_owned(),
            interval: Duration::from_secs(30),
            settle: Duration::from_secs(60),
            catch_up: Duration::from_secs(6 * HOUR),
            downsample_after: Duration::from_secs(24 * HOUR),
            keep: Duration::from_secs(14 * 24 * HOUR),
        }
    }
}

impl HistoryOptions {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.relation().map(|_| ())
    }

    pub(crate) fn relation(&self) -> Result<Relation> {
        let invalid =
            |field: &'static str, reason: String| Err(Error::InvalidOption { field, reason });
        let hour = Duration::from_secs(3600);
        let h = Relation::parse("history_table", &self.history_table)?;
        // Bounded, the sum below cannot overflow.
        Error::check_max_durations([
            ("interval", self.interval),
            ("settle", self.settle),
            ("catch_up", self.catch_up),
            ("downsample_after", self.downsample_after),
            ("keep", self.keep),
        ])?;
        if self.interval.is_zero() {
            return invalid("interval", "must be positive".into());
        }
        if self.catch_up < Duration::from_secs(60) {
            return invalid("catch_up", "must be at least 1 min".into());
        }
        let least = self.catch_up + self.settle + hour;
        if self.downsample_after < least {
            return invalid(
                "downsample_after",
                format!(
                    "must be at least catch_up + settle + 1h ({}), or a minute could be recorded after its hour was downsampled",
                    workerutil::duration::format(least)
                ),
            );
        }
        if self.keep < hour {
            return invalid("keep", "must be at least 1h".into());
        }
        Ok(h)
    }
}

/// What one pass wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recorded {
    /// Minute rows inserted (one per queue and minute with finished jobs).
    pub minutes: u64,
    /// Hour rows written by downsampling.
    pub hours: u64,
    /// Rows deleted as older than `keep`.
    pub removed: u64,
}

/// Writes one job table's history (see the [module](self)).
///
/// Any number of processes may run it over the same table: a pass
/// aggregates only closed minutes (ended at least `settle` ago), so every
/// process computes the same row for a queue and minute, and inserts it with
/// `ON CONFLICT DO NOTHING` on (job table, queue, minute): the first wins,
/// the others change nothing. No leader is needed (an upsert costs nothing
/// where a lease would add a table and a failover delay), and a process that
/// stops leaves the others recording. Downsampling deletes the minutes and
/// adds them to their hour in one statement, so each minute moves once.
#[derive(Debug, Clone)]
pub struct History {
    pool: PgPool,
    t: Arc<Table>,
    /// The job table's name in the history table's `job_table` column.
    key: String,
    h: Relation,
    options: HistoryOptions,
}

impl History {
    /// Validates `options` and checks that the history table exists with its
    /// columns, that the role may write it (`SELECT, INSERT, UPDATE,
    /// DELETE`) and that the job table has an index serving the aggregation
    /// (over `finished_at` for the final states: `dbworker migration
    /// --retention`), so no pass scans the table.
    pub async fn new(pool: &PgPool, table: &JobTable, options: HistoryOptions) -> Result<History> {
        let h = options.relation()?;
        crate::schema_check::require_columns(
            pool,
            &h,
            "history table",
            &COLUMNS,
            "`dbworker migration --history` prints it",
        )
        .await?;
        // A pass inserts minutes; downsampling deletes them and upserts
        // hours; retention deletes old rows.
        Grants::new("recording the job history")
            .on(
                "history table",
                &h,
                &[
                    Privilege::Select,
                    Privilege::Insert,
                    Privilege::Update,
                    Privilege::Delete,
                ],
            )
            .check(pool)
            .await?;
        let history = History {
            pool: pool.clone(),
            t: table.sql().clone(),
            key: table.name(),
            h,
            options,
        };
        history.check_index().await?;
        Ok(history)
    }

    /// Fails when the aggregation's plan scans the job table (no index over
    /// `finished_at` for the final states).
    async fn check_index(&self) -> Result<()> {
        let db = || Error::db("history");
        let mut tx = sql::begin_index_only(&self.pool).await.map_err(db())?;
        let record = sql::history_record(&self.t, &self.h, &self.key, 0, 60);
        let plan: serde_json::Value = sql::counts_explain(record)
            .fetch_one(&mut *tx)
            .await
            .map_err(db())?
            .get(0);
        tx.rollback().await.map_err(db())?;
        if scans_sequentially(&plan) {
            return Err(Error::Schema {
                problems: vec![format!(
                    "job table {} has no index over {} for the final states, so the history would scan the table (`dbworker migration --retention` prints it)",
                    self.key, self.t.columns.finished_at
                )],
            });
        }
        Ok(())
    }

    /// One pass: records the closed minutes not yet recorded (an hour of
    /// them per statement), downsamples, and deletes rows past `keep`.
    pub async fn record_once(&self) -> Result<Recorded> {
        let db = || Error::db("history");
        let o = &self.options;
        let bounds = sql::history_bounds(&self.h, &self.key, o.settle, o.catch_up)
            .fetch_one(&self.pool)
            .await
            .map_err(db())?;
        let (mut lo, hi): (i64, i64) = (bounds.get("lo"), bounds.get("hi"));
        let mut recorded = Recorded::default();
        while lo < hi {
            let to = hi.min(lo + sql::HOUR);
            // As in `Admin::status`: the planner takes the index that
            // `new` found, even where a small table would make a scan cheaper.
            let mut tx = sql::begin_index_only(&self.pool).await.map_err(db())?;
            recorded.minutes += sql::history_record(&self.t, &self.h, &self.key, lo, to)
                .execute(&mut *tx)
                .await
                .map_err(db())?
                .rows_affected();
            tx.commit().await.map_err(db())?;
            lo = to;
        }
        recorded.hours = sql::history_downsample(&self.h, &self.key, o.downsample_after)
            .execute(&self.pool)
            .await
            .map_err(db())?
            .rows_affected();
        recorded.removed = sql::history_purge(&self.h, &self.key, o.keep)
            .execute(&self.pool)
            .await
            .map_err(db())?
            .rows_affected();
        Ok(recorded)
    }
}

/// The history as the runner sees it: one [`History::record_once`] per pass.
struct Passes<'a> {
    history: &'a History,
}

impl Pass for Passes<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("history", table = %self.history.key)
    }

    async fn pass(&mut self) -> Next {
        match self.history.record_once().await {
            Ok(r) => {
                if r != Recorded::default() {
                    tracing::debug!(
                        minutes = r.minutes,
                        hours = r.hours,
                        removed = r.removed,
                        "history recorded"
                    );
                }
                Next::Interval
            }
            Err(err) => {
                tracing::error!(table = %self.history.key, error = %err, "history pass failed");
                Next::BackOff
            }
        }
    }
}

/// Whether an `EXPLAIN (FORMAT JSON)` plan scans a table sequentially.
fn scans_sequentially(plan: &serde_json::Value) -> bool {
    match plan {
        serde_json::Value::Object(node) => node.iter().any(|(key, value)| {
            (key == "Node Type" && value == "Seq Scan") || scans_sequentially(value)
        }),
        serde_json::Value::Array(items) => items.iter().any(scans_sequentially),
        _ => false,
    }
}

impl crate::Service for History {
    fn name(&self) -> &str {
        "history"
    }

    /// Runs a pass every `interval` (±10 %) until `stop` fires. A failed
    /// pass is logged and retried after a back-off doubling up to eight
    /// intervals; the minutes it missed are recorded by the next (within
    /// `catch_up`).
    async fn run(&self, stop: CancellationToken) -> crate::Result<()> {
        let interval = self.options.interval;
        Runner::every(interval)
            .jitter(0.1)
            .backoff_up_to(interval.saturating_mul(8))
            .run(&stop, &mut Passes { history: self })
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_read_from_a_config_file() {
        assert!(HistoryOptions::default().validate().is_ok());
        let o = HistoryOptions {
            downsample_after: Duration::from_secs(3600),
            ..HistoryOptions::default()
        };
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.contains("downsample_after") && e.contains("catch_up"),
            "{e}"
        );
        let o = HistoryOptions {
            history_table: "no; drop".into(),
            ..HistoryOptions::default()
        };
        assert!(
            o.validate()
                .unwrap_err()
                .to_string()
                .contains("history_table")
        );
        let o: HistoryOptions =
            serde_json::from_str(r#"{ "keep": "30d", "interval": "10s" }"#).unwrap();
        assert_eq!(o.keep, Duration::from_secs(30 * 86_400));
        assert_eq!(o.interval, Duration::from_secs(10));
        assert_eq!(o.history_table, DEFAULT_HISTORY_TABLE);
        assert!(serde_json::from_str::<HistoryOptions>(r#"{ "kept": "1d" }"#).is_err());
    }
}
