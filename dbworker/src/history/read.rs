//! Reading the history back: a time series over a range (the dashboard's
//! charts) and the totals per queue over a window (`dbworker top`).

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql;

/// The ranges the charts offer, each cut into steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Range {
    /// The last hour, a step per minute.
    #[default]
    #[serde(rename = "1h")]
    Hour,
    /// The last 24 hours, a step per 15 minutes.
    #[serde(rename = "24h")]
    Day,
    /// The last 7 days, a step per 3 hours.
    #[serde(rename = "7d")]
    Week,
}

impl Range {
    /// Every range, shortest first.
    pub const ALL: [Range; 3] = [Range::Hour, Range::Day, Range::Week];

    /// How it is written in a link: `1h`, `24h`, `7d`.
    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "1h",
            Range::Day => "24h",
            Range::Week => "7d",
        }
    }

    /// How long it covers.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.steps() * self.step().as_secs())
    }

    /// One step (one bar of a chart).
    pub fn step(self) -> Duration {
        Duration::from_secs(match self {
            Range::Hour => 60,
            Range::Day => 15 * 60,
            Range::Week => 3 * 3600,
        })
    }

    /// How many steps it covers.
    pub fn steps(self) -> u64 {
        match self {
            Range::Hour => 60,
            Range::Day => 96,
            Range::Week => 56,
        }
    }
}

impl FromStr for Range {
    type Err = Error;

    fn from_str(s: &str) -> Result<Range> {
        Range::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| Error::InvalidOption {
                field: "range",
                reason: format!("{s:?} is not one of 1h, 24h, 7d"),
            })
    }
}

/// Finished jobs over one step (or a whole range, or a queue's window).
/// Times in seconds; `None` where no job of the step started.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Point {
    /// The step's start, in seconds since the epoch (database clock).
    pub at: i64,
    /// Jobs completed.
    pub completed: u64,
    /// Jobs failed for good.
    pub failed: u64,
    /// Jobs canceled.
    pub canceled: u64,
    /// Attempts that errored and were retried, counted when their job finished.
    pub retried: u64,
    /// Jobs that started (those the times below are over).
    pub timed: u64,
    /// Median wait from due to start (approximated over many minutes).
    pub wait_p50: Option<f64>,
    /// 95th percentile of the wait (approximated over many minutes).
    pub wait_p95: Option<f64>,
    /// Longest wait (exact).
    pub wait_max: Option<f64>,
    /// Median run time from start to finish (approximated over many minutes).
    pub run_p50: Option<f64>,
    /// 95th percentile of the run time (approximated over many minutes).
    pub run_p95: Option<f64>,
    /// Longest run (exact).
    pub run_max: Option<f64>,
}

impl Point {
    fn read(row: &PgRow) -> Point {
        let n = |name: &str| {
            row.get::<Option<i64>, _>(name)
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0)
        };
        let f = |name: &str| row.get::<Option<f64>, _>(name);
        Point {
            at: 0,
            completed: n("completed"),
            failed: n("failed"),
            canceled: n("canceled"),
            retried: n("retried"),
            timed: n("timed"),
            wait_p50: f("wait_p50"),
            wait_p95: f("wait_p95"),
            wait_max: f("wait_max"),
            run_p50: f("run_p50"),
            run_p95: f("run_p95"),
            run_max: f("run_max"),
        }
    }

    /// Jobs finished (completed, failed or canceled).
    pub fn finished(&self) -> u64 {
        self.completed + self.failed + self.canceled
    }

    /// The points together: counts summed, maxima the largest, percentiles
    /// the points' weighted by their timed jobs (an approximation).
    pub fn merge<'a>(points: impl IntoIterator<Item = &'a Point>) -> Point {
        let points: Vec<&Point> = points.into_iter().collect();
        let weighted = |get: fn(&Point) -> Option<f64>| {
            let (mut sum, mut weight) = (0.0, 0.0);
            for p in &points {
                if let Some(v) = get(p) {
                    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
                    let w = p.timed as f64;
                    sum += v * w;
                    weight += w;
                }
            }
            (weight > 0.0).then(|| sum / weight)
        };
        let max =
            |get: fn(&Point) -> Option<f64>| points.iter().filter_map(|p| get(p)).reduce(f64::max);
        Point {
            at: points.first().map_or(0, |p| p.at),
            completed: points.iter().map(|p| p.completed).sum(),
            failed: points.iter().map(|p| p.failed).sum(),
            canceled: points.iter().map(|p| p.canceled).sum(),
            retried: points.iter().map(|p| p.retried).sum(),
            timed: points.iter().map(|p| p.timed).sum(),
            wait_p50: weighted(|p| p.wait_p50),
            wait_p95: weighted(|p| p.wait_p95),
            wait_max: max(|p| p.wait_max),
            run_p50: weighted(|p| p.run_p50),
            run_p95: weighted(|p| p.run_p95),
            run_max: max(|p| p.run_max),
        }
    }
}

/// A job table's history over a [`Range`]: one point per step that has
/// finished jobs (steps without are absent), oldest first, and the total.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Series {
    /// The range.
    pub range: Range,
    /// The database clock when it was read, seconds since the epoch.
    pub now: f64,
    /// The first step's start (seconds since the epoch); the steps run
    /// from it every [`Range::step`] up to the one holding `now`.
    pub from: i64,
    /// The steps with finished jobs, oldest first.
    pub points: Vec<Point>,
    /// Every step together.
    pub total: Point,
}

/// The history table's relation and the database clock, or `None` when the
/// table does not exist.
async fn clock(pool: &PgPool, history_table: &str) -> Result<Option<(Relation, f64)>> {
    let h = Relation::parse("history_table", history_table)?;
    let row = sql::history_clock(&h)
        .fetch_one(pool)
        .await
        .map_err(Error::db("history"))?;
    Ok(row.get::<bool, _>("exists").then(|| (h, row.get("now"))))
}

/// Job table `job_table`'s history (by its [`JobTable::name`](crate::JobTable::name))
/// over `range`, every queue together; `None` when the history table does
/// not exist.
pub async fn series(
    pool: &PgPool,
    history_table: &str,
    job_table: &str,
    range: Range,
) -> Result<Option<Series>> {
    let Some((h, now)) = clock(pool, history_table).await? else {
        return Ok(None);
    };
    let step = i64::try_from(range.step().as_secs()).unwrap_or(i64::MAX);
    let steps = i64::try_from(range.steps()).unwrap_or(i64::MAX);
    #[allow(clippy::cast_possible_truncation)] // seconds since the epoch
    let current = (now.floor() as i64).div_euclid(step) * step;
    let from = current - (steps - 1) * step;
    let rows = sql::history_series(&h, job_table, from, step)
        .fetch_all(pool)
        .await
        .map_err(Error::db("history"))?;
    let points: Vec<Point> = rows
        .iter()
        .map(|row| Point {
            at: row.get("at"),
            ..Point::read(row)
        })
        .collect();
    let total = Point {
        at: from,
        ..Point::merge(&points)
    };
    Ok(Some(Series {
        range,
        now,
        from,
        points,
        total,
    }))
}

/// One queue's history over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueHistory {
    /// The queue (`None`: the table has no queue column).
    pub queue: Option<String>,
    /// Its finished jobs over the window.
    pub point: Point,
}

/// Job table `job_table`'s history per queue over the last `window`
/// (whole minutes; the minutes not yet recorded are missing), the newest
/// minute within it included; `None` when the history table does not exist.
pub async fn by_queue(
    pool: &PgPool,
    history_table: &str,
    job_table: &str,
    window: Duration,
) -> Result<Option<Vec<QueueHistory>>> {
    let Some((h, now)) = clock(pool, history_table).await? else {
        return Ok(None);
    };
    let window = i64::try_from(window.as_secs()).unwrap_or(i64::MAX / 2);
    #[allow(clippy::cast_possible_truncation)] // seconds since the epoch
    let from = now.floor() as i64 - window;
    let rows = sql::history_by_queue(&h, job_table, from)
        .fetch_all(pool)
        .await
        .map_err(Error::db("history"))?;
    Ok(Some(
        rows.iter()
            .map(|row| {
                let queue: String = row.get("queue");
                QueueHistory {
                    queue: (!queue.is_empty()).then_some(queue),
                    point: Point {
                        at: from,
                        ..Point::read(row)
                    },
                }
            })
            .collect(),
    ))
}
