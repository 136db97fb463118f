//! Global limits per queue — jobs processing at once, jobs processing at once
//! per key, jobs started per second — stored in Postgres and enforced by the
//! claim itself across every worker process.

use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::grants::Privilege;
use crate::sql;
use crate::table::JobTable;

use super::ControlTable;

/// The limit table's default name.
pub const DEFAULT_LIMIT_TABLE: &str = crate::columns::STANDARD_LIMIT_TABLE;

/// One queue's limits; every field `None` means no such limit.
///
/// ```
/// use dbworker::control::Limit;
/// // At most 3 processing, one per customer, 10 started per second (bursts of 20).
/// let limit = Limit::processing(3).per_key(1).rate(10.0, 20);
/// assert_eq!(limit.max_per_key, Some(1));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Limit {
    /// At most this many jobs of the queue processing at once (0 stops it).
    pub max_processing: Option<u32>,
    /// At most this many jobs of the queue processing at once with one value
    /// of the table's `limit_key_column` (jobs whose value is NULL are not
    /// limited per key). Needs `JobTableOptions::limit_key_column`.
    pub max_per_key: Option<u32>,
    /// At most this many jobs of the queue started per second, on average.
    pub rate_per_second: Option<f64>,
    /// With a rate: how many starts may be saved up while the queue is idle
    /// and spent at once. Default: the rate rounded up (at least 1).
    pub burst: Option<u32>,
}

impl Limit {
    /// At most `max` jobs processing at once.
    pub fn processing(max: u32) -> Limit {
        Limit {
            max_processing: Some(max),
            ..Limit::default()
        }
    }

    /// And at most `max` processing at once per key.
    pub fn per_key(mut self, max: u32) -> Limit {
        self.max_per_key = Some(max);
        self
    }

    /// And at most `per_second` started per second, with bursts of `burst`.
    pub fn rate(mut self, per_second: f64, burst: u32) -> Limit {
        self.rate_per_second = Some(per_second);
        self.burst = Some(burst);
        self
    }

    /// Checks the values: a positive finite rate, a burst of at least 1 and
    /// only with a rate, counts that fit the table's integers.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        if let Some(rate) = self.rate_per_second
            && !(rate.is_finite() && rate > 0.0)
        {
            return invalid("rate_per_second", "must be a positive number");
        }
        if self
            .rate_per_second
            .is_some_and(|rate| rate > f64::from(i32::MAX))
        {
            return invalid("rate_per_second", "is too large (at most 2147483647)");
        }
        match self.burst {
            Some(_) if self.rate_per_second.is_none() => {
                invalid("burst", "only applies with rate_per_second")
            }
            Some(0) => invalid("burst", "must be at least 1"),
            _ => {
                for (field, n) in [
                    ("max_processing", self.max_processing),
                    ("max_per_key", self.max_per_key),
                    ("burst", self.burst),
                ] {
                    if n.is_some_and(|n| i32::try_from(n).is_err()) {
                        return invalid(field, "is too large");
                    }
                }
                Ok(())
            }
        }
    }
}

/// Sets and removes the global limits of a job table's queues, for every
/// worker whose table sets `JobTableOptions::limit_table`. A new limit applies
/// at the next claim; jobs already processing are not stopped. A new rate
/// starts with an empty bucket.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::control::{Limit, Limits};
/// let mut options = dbworker::JobTableOptions::detected("jobs");
/// options.limit_table = Some(dbworker::control::DEFAULT_LIMIT_TABLE.into());
/// let jobs = dbworker::JobTable::new(&pool, options).await?;
/// let limits = Limits::new(&pool, &jobs).await?;
/// limits.set("reports", 3).await?; // at most 3 reports processing anywhere
/// limits.set_limit("emails", Limit::default().rate(50.0, 100)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Limits {
    t: ControlTable,
    /// Whether the description names `limit_key_column`: without it a
    /// per-key limit cannot be enforced, and would still send every claim of
    /// the table down the serialized limited path.
    has_key_column: bool,
}

impl Limits {
    /// Whether its description of the job table names a queue column (the
    /// dashboard lists queues, with their forms, only then).
    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn has_queues(&self) -> bool {
        self.t.has_queues()
    }

    /// Limits of `table`, kept in its limit table (`JobTableOptions::limit_table`).
    /// Checks that the role may read it (`SELECT`); a tool that sets limits
    /// checks [`check_writes`](Self::check_writes) too.
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Limits> {
        let t = ControlTable::of(
            pool,
            table,
            table.sql().limit_table.as_ref(),
            "limit_table",
            "--limits",
        )?;
        t.check("limit table", "reading limits", &[Privilege::Select])
            .await?;
        Ok(Limits {
            t,
            has_key_column: table.sql().limit_key_column.is_some(),
        })
    }

    /// Checks the grants setting (`INSERT`, `UPDATE`) and removing
    /// (`DELETE`) limits use, naming each missing one with its `GRANT`.
    pub async fn check_writes(&self) -> Result<()> {
        self.t
            .check(
                "limit table",
                "setting limits",
                &[
                    Privilege::Select,
                    Privilege::Insert,
                    Privilege::Update,
                    Privilege::Delete,
                ],
            )
            .await
    }

    /// Allows at most `max_processing` jobs of `queue` to be processing at once
    /// (0 stops claiming it); the queue's other limits are lifted.
    pub async fn set(&self, queue: &str, max_processing: u32) -> Result<()> {
        self.set_limit(queue, Limit::processing(max_processing))
            .await
    }

    /// Replaces `queue`'s limits with `limit`. Refuses a queue name that is
    /// empty, blank or has whitespace at an end, and a per-key limit when the
    /// table's description names no `limit_key_column`.
    pub async fn set_limit(&self, queue: &str, limit: Limit) -> Result<()> {
        super::check_queue_name(queue)?;
        limit.validate()?;
        if limit.max_per_key.is_some() && !self.has_key_column {
            return Err(Error::InvalidOption {
                field: "max_per_key",
                reason: "needs the column that keys it: this table's description names no \
                         limit_key_column (JobTableOptions::limit_key_column)"
                    .to_owned(),
            });
        }
        let row = sql::LimitRow {
            max_processing: limit.max_processing,
            max_per_key: limit.max_per_key,
            rate_per_second: limit.rate_per_second,
            burst: limit.burst,
        };
        sql::set_limit(&self.t.table, &self.t.job_table, queue, row)
            .execute(&self.t.pool)
            .await
            .map_err(Error::db("set_limit"))?;
        Ok(())
    }

    /// Removes `queue`'s limits; returns whether it had any.
    pub async fn remove(&self, queue: &str) -> Result<bool> {
        let done = sql::remove_limit(&self.t.table, &self.t.job_table, queue)
            .execute(&self.t.pool)
            .await
            .map_err(Error::db("remove_limit"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The limits in force, by queue.
    pub async fn list(&self) -> Result<Vec<(String, Limit)>> {
        let rows = sql::list_limits(&self.t.table, &self.t.job_table)
            .fetch_all(&self.t.pool)
            .await
            .map_err(Error::db("list_limits"))?;
        let count = |r: &sqlx::postgres::PgRow, c: &str| {
            r.get::<Option<i32>, _>(c)
                .map(|n| u32::try_from(n).unwrap_or(0))
        };
        Ok(rows
            .iter()
            .map(|r| {
                let limit = Limit {
                    max_processing: count(r, "max_processing"),
                    max_per_key: count(r, "max_per_key"),
                    rate_per_second: r.get("rate_per_second"),
                    burst: count(r, "burst"),
                };
                (r.get("queue"), limit)
            })
            .collect())
    }
}
