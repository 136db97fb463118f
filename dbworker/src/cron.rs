//! Periodic jobs: cron schedules declared in code, each tick enqueued exactly
//! once however many processes run the scheduler (no leader needed).

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::columns::Relation;
use crate::enqueue::{EnqueueOptions, Enqueuer, NewJob};
use crate::error::{Error, Result};
use crate::sql;

/// The cron table's default name.
pub const DEFAULT_CRON_TABLE: &str = "dbworker_cron";

/// Where a [`Scheduler`] enqueues and records its ticks.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// The job table the ticks' jobs go to (and its optional columns).
    pub enqueue: EnqueueOptions,
    /// The cron table (it must exist; one serves every job table). Default
    /// [`DEFAULT_CRON_TABLE`].
    pub cron_table: String,
    /// How often [`Scheduler::run`] looks for due ticks. At least 10 ms.
    /// Default 1 s.
    pub interval: Duration,
}

impl SchedulerOptions {
    /// Ticks enqueued through `enqueue`, recorded in the default cron table.
    pub fn new(enqueue: EnqueueOptions) -> SchedulerOptions {
        SchedulerOptions {
            enqueue,
            cron_table: DEFAULT_CRON_TABLE.to_owned(),
            interval: Duration::from_secs(1),
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.enqueue.validate()?;
        Relation::parse("cron_table", &self.cron_table)?;
        if self.interval < Duration::from_millis(10) {
            return Err(Error::InvalidOption {
                field: "interval",
                reason: "must be at least 10ms".to_owned(),
            });
        }
        Ok(())
    }
}

/// What happens to ticks missed while no scheduler ran (downtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backfill {
    /// Enqueue the latest due tick only if it is at most `grace` late; older
    /// missed ticks are dropped.
    Skip {
        /// How late a tick may be and still run.
        grace: Duration,
    },
    /// Enqueue one job for the latest due tick however late (a run that
    /// "catches up" once, never once per missed tick).
    RunOnce,
}

impl Default for Backfill {
    fn default() -> Self {
        Backfill::Skip {
            grace: Duration::from_secs(60),
        }
    }
}

/// One named schedule and the job each tick enqueues.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    schedule: cron::Schedule,
    job: NewJob,
    backfill: Backfill,
}

/// Enqueues the jobs of cron schedules. Every process may run one: for each
/// schedule, the row of the cron table is locked, the due tick found by the
/// database clock, the job enqueued and `last_tick` advanced in one
/// transaction, so each tick is enqueued exactly once.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::{NewJob, cron::{Backfill, Scheduler, SchedulerOptions}, enqueue::EnqueueOptions};
/// let scheduler = Scheduler::new(&pool, SchedulerOptions::new(EnqueueOptions::new("jobs")))
///     .await?
///     // Standard 5 fields (minute hour day month weekday), or 6 with seconds first.
///     .add("nightly-report", "0 3 * * *", NewJob::new().kind("report"), Backfill::RunOnce)?;
/// scheduler.run(tokio_util::sync::CancellationToken::new()).await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Scheduler {
    pool: PgPool,
    enqueuer: Enqueuer,
    cron_table: Relation,
    job_table: String,
    entries: Vec<Entry>,
    interval: Duration,
}

impl Scheduler {
    /// A scheduler enqueueing into `options.enqueue`'s table, recording ticks
    /// in `options.cron_table` (which must exist). Add schedules with
    /// [`add`](Self::add).
    pub async fn new(pool: &PgPool, options: SchedulerOptions) -> Result<Scheduler> {
        options.validate()?;
        let enqueuer = Enqueuer::new(pool, options.enqueue).await?;
        let cron_table = Relation::parse("cron_table", &options.cron_table)?;
        crate::schema_check::require_columns(
            pool,
            &cron_table,
            "cron table",
            &["job_table", "schedule", "last_tick"],
            "`dbworker migration --cron` prints it",
        )
        .await?;
        Ok(Scheduler {
            pool: pool.clone(),
            job_table: sql::pause_key(enqueuer.table()),
            enqueuer,
            cron_table,
            entries: Vec::new(),
            interval: options.interval,
        })
    }

    /// Adds a schedule: `expression` in standard cron syntax (5 fields, or 6
    /// with seconds first; UTC), `job` enqueued at each tick.
    pub fn add(
        mut self,
        name: impl Into<String>,
        expression: &str,
        job: NewJob,
        backfill: Backfill,
    ) -> Result<Self> {
        let name = name.into();
        let fields = expression.split_whitespace().count();
        let normalized = match fields {
            5 => format!("0 {expression}"),
            6 => expression.to_owned(),
            _ => {
                return Err(Error::InvalidOption {
                    field: "expression",
                    reason: format!(
                        "{expression:?} has {fields} fields; expected 5 (minute hour day month weekday) or 6 (seconds first)"
                    ),
                });
            }
        };
        let schedule = cron::Schedule::from_str(&normalized).map_err(|e| Error::InvalidOption {
            field: "expression",
            reason: format!("{expression:?}: {e}"),
        })?;
        if self.entries.iter().any(|e| e.name == name) {
            return Err(Error::InvalidOption {
                field: "name",
                reason: format!("schedule {name:?} is added twice"),
            });
        }
        self.entries.push(Entry {
            name,
            schedule,
            job,
            backfill,
        });
        Ok(self)
    }

    /// One pass: enqueues each schedule's due tick, if any. Returns the
    /// schedules that enqueued, with the job id. A schedule seen for the first
    /// time starts from now: its first job is its next tick.
    pub async fn tick(&self) -> Result<Vec<(String, i64)>> {
        let mut enqueued = Vec::new();
        for entry in &self.entries {
            if let Some(id) = self.tick_one(entry).await? {
                enqueued.push((entry.name.clone(), id));
            }
        }
        Ok(enqueued)
    }

    async fn tick_one(&self, entry: &Entry) -> Result<Option<i64>> {
        let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
        sql::cron_register(&self.cron_table, &self.job_table, &entry.name)
            .query()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("cron"))?;
        // Locks the schedule's row: concurrent schedulers wait here, then see
        // the tick this one advanced to.
        let row = sql::cron_state(&self.cron_table, &self.job_table, &entry.name)
            .query()
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("cron"))?;
        let (last, now) = (micros(row.get("last_tick")), micros(row.get("now")));
        let Some(due) = latest_tick(&entry.schedule, last, now) else {
            // Keeps a first registration; releases the row lock.
            tx.commit().await.map_err(Error::db("commit"))?;
            return Ok(None);
        };
        let run = match entry.backfill {
            Backfill::RunOnce => true,
            Backfill::Skip { grace } => {
                let late = now.signed_duration_since(due).to_std().unwrap_or_default();
                late <= grace
            }
        };
        let id = if run {
            Some(self.enqueuer.enqueue_in(&mut tx, &entry.job).await?.id())
        } else {
            tracing::info!(schedule = %entry.name, tick = %due, "skipped a tick missed while no scheduler ran");
            None
        };
        sql::cron_advance(
            &self.cron_table,
            &self.job_table,
            &entry.name,
            due.timestamp_micros(),
        )
        .query()
        .execute(&mut *tx)
        .await
        .map_err(Error::db("cron"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(id)
    }

    /// Ticks every `interval` until `stop` fires; a failed pass is logged and
    /// retried at the next.
    pub async fn run(&self, stop: CancellationToken) {
        loop {
            if let Err(err) = self.tick().await {
                tracing::error!(error = %err, "cron pass failed");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

fn micros(value: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(value).unwrap_or_default()
}

/// The latest tick in `(last, now]`, if any.
fn latest_tick(
    schedule: &cron::Schedule,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // Bounded: a per-second schedule after a year offline is 3e7 steps at most.
    schedule
        .after(&last)
        .take(50_000_000)
        .take_while(|t| *t <= now)
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_due_tick_is_found_and_none_before_the_first() {
        let hourly = cron::Schedule::from_str("0 0 * * * *").unwrap();
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        assert_eq!(
            latest_tick(
                &hourly,
                at("2026-01-01T00:30:00Z"),
                at("2026-01-01T03:10:00Z")
            ),
            Some(at("2026-01-01T03:00:00Z"))
        );
        assert_eq!(
            latest_tick(
                &hourly,
                at("2026-01-01T00:30:00Z"),
                at("2026-01-01T00:59:59Z")
            ),
            None
        );
    }
}
