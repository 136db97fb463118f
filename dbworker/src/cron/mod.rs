//! Periodic jobs: cron schedules declared in code or read from a crontab,
//! each tick enqueued exactly once however many processes run the scheduler
//! (no leader needed).
//!
#![doc = include_str!("../../docs/modules/cron.md")]

mod crontab;
mod pass;
pub(crate) mod schedule;
mod ticks;

use std::time::Duration;

use serde_json::{Map, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::columns::Relation;
use crate::enqueue::{Enqueuer, NewJob};
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::runner::{Next, Pass as RunnerPass, Runner};
use crate::sql;
use crate::table::JobTable;
pub use crontab::{Crontab, CrontabEntry};
use schedule::Schedule;
pub use ticks::Backfill;

/// The cron table's default name.
pub const DEFAULT_CRON_TABLE: &str = "dbworker_cron";

/// The cron table's columns, checked by [`Scheduler::new`] and by the
/// dashboard's cron page (which reads them without running a scheduler).
pub(crate) const CRON_COLUMNS: &[&str] = &[
    "job_table",
    "schedule",
    "last_tick",
    "expression",
    "time_zone",
    "last_job_id",
];

/// Where a missing cron table or column comes from.
pub(crate) const CRON_TABLE_HINT: &str = "`dbworker migration --cron` prints it";

/// Where a [`Scheduler`] records its ticks, and how often it looks.
/// Deserializable from a config file (fields left out keep their defaults;
/// `interval` as in [`workerutil::duration`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// The cron table (it must exist; one serves every job table). Default
    /// [`DEFAULT_CRON_TABLE`].
    pub cron_table: String,
    /// How often the scheduler's [`run`](crate::Service::run) looks for due ticks. At least 10 ms.
    /// Default 1 s.
    #[serde(with = "workerutil::duration")]
    pub interval: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            cron_table: DEFAULT_CRON_TABLE.to_owned(),
            interval: Duration::from_secs(1),
        }
    }
}

impl SchedulerOptions {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        Relation::parse("cron_table", &self.cron_table)?;
        // A pass adds a minute to it.
        Error::check_max_durations([("interval", self.interval)])?;
        if self.interval < Duration::from_millis(10) {
            return Err(Error::InvalidOption {
                field: "interval",
                reason: "must be at least 10ms".to_owned(),
            });
        }
        Ok(())
    }
}

/// One named schedule and the job each tick enqueues.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    /// `Err`: a crontab line's time zone this build does not know; the
    /// schedule fails every pass (naming the zone), the others run.
    schedule: std::result::Result<Schedule, String>,
    job: NewJob,
    backfill: Backfill,
    /// A crontab entry's payload: each job gets it, plus `_cron`, in the
    /// payload column.
    payload: Option<Map<String, Value>>,
    /// A crontab entry's line, for the logs.
    line: Option<usize>,
}

/// Enqueues the jobs of cron schedules. Every process may run one: for each
/// schedule, the row of the cron table is locked, the due tick found by the
/// database clock, the job enqueued and `last_tick` advanced in one
/// transaction, so each tick is enqueued exactly once.
///
/// ```no_run
/// # use dbworker::Service;
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::{JobTable, JobTableOptions, NewJob, cron::{Backfill, Scheduler, SchedulerOptions}};
/// let jobs = JobTable::new(&pool, JobTableOptions::detected("jobs")).await?;
/// let scheduler = Scheduler::new(&pool, &jobs, SchedulerOptions::default())
///     .await?
///     // Standard 5 fields (minute hour day month weekday), or 6 with seconds first.
///     .add("nightly-report", "0 3 * * *", NewJob::new().kind("report"), Backfill::RunOnce)?;
/// scheduler.run(tokio_util::sync::CancellationToken::new()).await?;
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
    payload_column: Option<String>,
}

impl Scheduler {
    /// A scheduler enqueueing into `table`, recording ticks in
    /// `options.cron_table` (which must exist; the role needs `SELECT,
    /// INSERT, UPDATE` on it and an enqueuer's grants). Add schedules with
    /// [`add`](Self::add).
    pub async fn new(
        pool: &PgPool,
        table: &JobTable,
        options: SchedulerOptions,
    ) -> Result<Scheduler> {
        options.validate()?;
        let enqueuer = Enqueuer::new(pool, table).await?;
        let cron_table = Relation::parse("cron_table", &options.cron_table)?;
        let mut problems = crate::schema_check::missing_columns(
            pool,
            &cron_table,
            "cron table",
            CRON_COLUMNS,
            CRON_TABLE_HINT,
        )
        .await?;
        for p in problems.iter_mut().filter(|p| p.contains("has no column")) {
            // A table made before the dashboard's cron page.
            p.push_str(" (`dbworker migration --cron` prints the ALTER TABLE that adds it)");
        }
        // Schedules are upserted, each pass locks its schedule's row and
        // advances it.
        problems.extend(
            Grants::new("a cron scheduler")
                .on(
                    "cron table",
                    &cron_table,
                    &[Privilege::Select, Privilege::Insert, Privilege::Update],
                )
                .problems(pool)
                .await?,
        );
        crate::schema_check::none(problems)?;
        Ok(Scheduler {
            pool: pool.clone(),
            job_table: sql::pause_key(enqueuer.table()),
            enqueuer,
            cron_table,
            entries: Vec::new(),
            interval: options.interval,
            payload_column: table.payload_column().map(str::to_owned),
        })
    }

    /// Adds a schedule: `expression` in standard cron syntax (5 fields, or 6
    /// with seconds first; weekdays 0-7 with Sunday 0 or 7), read in UTC or,
    /// after a `CRON_TZ=` prefix, in that IANA time zone
    /// (`CRON_TZ=Europe/Berlin 0 3 * * *`, as robfig/cron reads it); `job`
    /// enqueued at each tick. A bad expression or an unknown zone is refused
    /// here, naming the schedule.
    pub fn add(
        self,
        name: impl Into<String>,
        expression: &str,
        job: NewJob,
        backfill: Backfill,
    ) -> Result<Self> {
        let name = name.into();
        let schedule = Schedule::parse(expression).map_err(|e| named(&name, e))?;
        self.add_schedule(name, schedule, job, backfill)
    }

    /// [`add`](Self::add) with the time zone apart: `expression`'s fields
    /// are read in `time_zone`, an IANA name (`Europe/Berlin`,
    /// `America/New_York`, `UTC`). Across a daylight-saving change each
    /// local tick is enqueued once: see
    /// [time zones and daylight saving](crate::cron#time-zones-and-daylight-saving).
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
    /// use dbworker::{JobTable, JobTableOptions, NewJob, cron::{Backfill, Scheduler, SchedulerOptions}};
    /// let jobs = JobTable::new(&pool, JobTableOptions::detected("jobs")).await?;
    /// let scheduler = Scheduler::new(&pool, &jobs, SchedulerOptions::default())
    ///     .await?
    ///     // 03:00 in Berlin, summer and winter (01:00 or 02:00 UTC).
    ///     .add_in_zone("berlin-report", "0 3 * * *", "Europe/Berlin", NewJob::new().kind("report"), Backfill::RunOnce)?;
    /// # let _ = scheduler; Ok(()) }
    /// ```
    pub fn add_in_zone(
        self,
        name: impl Into<String>,
        expression: &str,
        time_zone: &str,
        job: NewJob,
        backfill: Backfill,
    ) -> Result<Self> {
        let name = name.into();
        if let (Some(prefix), _) = schedule::split_zone(expression) {
            return Err(named(
                &name,
                Error::InvalidOption {
                    field: "time_zone",
                    reason: format!(
                        "given twice: CRON_TZ={prefix} in the expression and {time_zone:?}"
                    ),
                },
            ));
        }
        let schedule = Schedule::parse(expression)
            .and_then(|s| s.in_zone(time_zone))
            .map_err(|e| named(&name, e))?;
        self.add_schedule(name, schedule, job, backfill)
    }

    fn add_schedule(
        self,
        name: String,
        schedule: Schedule,
        job: NewJob,
        backfill: Backfill,
    ) -> Result<Self> {
        // Refused now, not at every tick (a NUL, a column set it cannot take).
        self.enqueuer.check_job(&job)?;
        self.push(name, Ok(schedule), job, backfill, None)
    }

    /// Adds every entry of a crontab: each tick enqueues a job of the entry's
    /// kind (needs the table's kind column; `?queue=`, `?priority=` and
    /// `?max=` need their columns too) whose payload column
    /// ([`JobTableOptions::payload_column`](crate::JobTableOptions::payload_column)) holds the entry's JSON plus
    /// `_cron: {"ts": <the tick, RFC 3339>, "backfilled": <bool>}`. `?fill=`
    /// is [`Backfill::Fill`]; without it, [`Backfill::default`].
    ///
    /// A line's `CRON_TZ=` names its time zone. One this build's time-zone
    /// database does not know (a typo, or a zone newer than the build:
    /// several builds may share a crontab) is logged now and fails that
    /// schedule's every pass with an error naming the schedule, its line and
    /// the zone ([`tick`](Self::tick)); the other lines run.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use dbworker::{JobTable, JobTableOptions, cron::{Crontab, Scheduler, SchedulerOptions}};
    /// // `kind` and `payload` (`dbworker migration --typed`).
    /// let jobs = JobTable::new(&pool, JobTableOptions::typed("jobs")).await?;
    /// let crontab = Crontab::parse(&std::fs::read_to_string("crontab")?)?;
    /// let scheduler = Scheduler::new(&pool, &jobs, SchedulerOptions::default())
    ///     .await?
    ///     .crontab(&crontab)?;
    /// # let _ = scheduler; Ok(()) }
    /// ```
    pub fn crontab(mut self, crontab: &Crontab) -> Result<Self> {
        if self.payload_column.is_none() {
            return Err(Error::InvalidOption {
                field: "payload_column",
                reason: "a crontab's jobs carry their payload and `_cron` in the table's payload column; set JobTableOptions::payload_column".into(),
            });
        }
        for e in crontab.entries() {
            let at_line = |reason: String| Error::Crontab {
                line: e.line,
                reason,
            };
            let mut job = NewJob::new().kind(e.kind.clone());
            if let Some(queue) = &e.queue {
                job = job.queue(queue.clone());
            }
            if let Some(priority) = e.priority {
                job = job.priority(priority);
            }
            if let Some(max) = e.max_attempts {
                job = job.max_retries(max.saturating_sub(1));
            }
            self.enqueuer
                .check_job(&job)
                .map_err(|err| at_line(err.to_string()))?;
            let schedule = Schedule::parse_five(&e.expression).map_err(at_line)?;
            let schedule = match &e.time_zone {
                None => Ok(schedule),
                Some(zone) => schedule.in_zone(zone).map_err(|err| {
                    tracing::error!(schedule = %e.id, crontab_line = e.line, time_zone = %zone, error = %err, "cron schedule's time zone is unknown: it fails every pass; the other schedules go on");
                    match err {
                        Error::InvalidOption { reason, .. } => reason,
                        other => other.to_string(),
                    }
                }),
            };
            let backfill = e
                .fill
                .map_or_else(Backfill::default, |window| Backfill::Fill { window });
            self = self
                .push(
                    e.id.clone(),
                    schedule,
                    job,
                    backfill,
                    Some(e.payload.clone()),
                )
                .map_err(|err| at_line(err.to_string()))?;
            if let Some(entry) = self.entries.last_mut() {
                entry.line = Some(e.line);
            }
        }
        Ok(self)
    }

    fn push(
        mut self,
        name: String,
        schedule: std::result::Result<Schedule, String>,
        job: NewJob,
        backfill: Backfill,
        payload: Option<Map<String, Value>>,
    ) -> Result<Self> {
        if self.entries.iter().any(|e| e.name == name) {
            return Err(Error::InvalidOption {
                field: "name",
                reason: format!("schedule {name:?} is added twice"),
            });
        }
        // Bound into every pass of the schedule, it would fail them all.
        if name.contains('\0') {
            return Err(Error::InvalidOption {
                field: "name",
                reason: format!("schedule {name:?} holds a NUL character (U+0000)"),
            });
        }
        self.entries.push(Entry {
            name,
            schedule,
            job,
            backfill,
            payload,
            line: None,
        });
        Ok(self)
    }

    /// One pass: enqueues each schedule's due ticks, if any (one, or with
    /// [`Backfill::Fill`] every missed one in the window). Returns the
    /// schedules that enqueued, with the job ids, oldest tick first. A
    /// schedule seen for the first time starts from now: its first job is
    /// its next tick.
    ///
    /// Each schedule's pass is its own transaction: one that fails is logged
    /// (naming the schedule and its crontab line), its tick is tried again
    /// next pass, and the others run all the same. The first failure is then
    /// returned as [`Error::CronSchedule`] (what the others enqueued is
    /// committed).
    pub async fn tick(&self) -> Result<Vec<(String, i64)>> {
        let pass = self.tick_all().await;
        match pass.first_failure {
            Some(err) => Err(err),
            None => Ok(pass.enqueued),
        }
    }

    /// Every schedule's pass, each logged as it fails.
    async fn tick_all(&self) -> Pass {
        let mut pass = Pass {
            enqueued: Vec::new(),
            first_failure: None,
            failed: 0,
        };
        for entry in &self.entries {
            match self.tick_one(entry).await {
                Ok(ids) => pass
                    .enqueued
                    .extend(ids.into_iter().map(|id| (entry.name.clone(), id))),
                Err(err) => {
                    tracing::error!(schedule = %entry.name, crontab_line = entry.line, error = %err, "cron schedule's pass failed; the other schedules go on");
                    pass.failed += 1;
                    pass.first_failure.get_or_insert(Error::CronSchedule {
                        schedule: entry.name.clone(),
                        line: entry.line,
                        source: Box::new(err),
                    });
                }
            }
        }
        pass
    }
}

/// The scheduler as the runner sees it: one [`Scheduler::tick`] per pass.
struct Ticks<'a>(&'a Scheduler);

impl RunnerPass for Ticks<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("cron", table = %self.0.job_table)
    }

    async fn pass(&mut self) -> Next {
        let failed = self.0.tick_all().await.failed;
        // One broken schedule must not delay the others' ticks: only a pass
        // where every schedule failed backs off.
        if failed > 0 && failed == self.0.entries.len() {
            Next::BackOff
        } else {
            Next::Interval
        }
    }
}

/// What one pass over the schedules did.
struct Pass {
    /// The jobs enqueued, by schedule, oldest tick first.
    enqueued: Vec<(String, i64)>,
    first_failure: Option<Error>,
    /// How many schedules failed.
    failed: usize,
}

/// A schedule's error from `add`, naming it.
fn named(schedule: &str, err: Error) -> Error {
    Error::CronSchedule {
        schedule: schedule.to_owned(),
        line: None,
        source: Box::new(err),
    }
}

impl crate::Service for Scheduler {
    fn name(&self) -> &str {
        "cron"
    }

    /// Ticks every `interval` until `stop` fires; a failed schedule is
    /// logged (by [`tick`](Self::tick)) and retried at the next pass. Only
    /// when every schedule fails (the database, most likely) does the next
    /// pass wait longer: twice the interval, doubling with each such pass in
    /// a row up to 10 s (or the interval, if longer).
    async fn run(&self, stop: CancellationToken) -> crate::Result<()> {
        Runner::every(self.interval)
            .backoff_up_to(Duration::from_secs(10))
            .run(&stop, &mut Ticks(self))
            .await;
        Ok(())
    }
}
