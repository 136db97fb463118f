//! One schedule's pass: its transaction, bounded by the tick's lock and idle
//! timeouts, that locks its row, finds the due ticks, enqueues their jobs and
//! advances `last_tick`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use sqlx::Row;

use super::schedule::Schedule;
use super::ticks::{Due, due_ticks};
use super::{Entry, Scheduler};
use crate::enqueue::NewJob;
use crate::error::{Error, Result};
use crate::sql;

impl Scheduler {
    /// One schedule's pass, in its own transaction: a lock not granted in
    /// time leaves its due tick to the next pass.
    pub(super) async fn tick_one(&self, entry: &Entry) -> Result<Vec<i64>> {
        let schedule = entry
            .schedule
            .as_ref()
            .map_err(|reason| Error::InvalidOption {
                field: "time_zone",
                reason: reason.clone(),
            })?;
        let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
        sql::cron_tick_timeouts(TICK_LOCK_TIMEOUT, TICK_IDLE_TIMEOUT)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("cron"))?;
        match self.tick_locked(&mut tx, entry, schedule).await {
            Ok(ids) => {
                tx.commit().await.map_err(Error::db("commit"))?;
                Ok(ids)
            }
            // The enqueue waited too long for a lock (a keyed job's holder
            // locked by a transaction): the rollback keeps the tick due, for
            // the next pass. The other schedules go on meanwhile.
            Err(Error::Database {
                op: ENQUEUE_LOCK_NOT_GRANTED,
                ..
            }) => {
                tracing::warn!(schedule = %entry.name, "the tick's job waits for a lock a transaction holds (its key's holder, mid-attempt); the tick is tried again at the next pass");
                Ok(Vec::new())
            }
            // lock_not_available: another scheduler holds this schedule's row
            // (mid-tick, paused or stuck); it is its tick, and the next pass
            // looks again. The other schedules go on meanwhile.
            Err(Error::Database { source, .. }) if crate::error::has_sqlstate(&source, "55P03") => {
                tracing::info!(schedule = %entry.name, "another scheduler holds this schedule's row; left to it for this pass");
                Ok(Vec::new())
            }
            Err(err) => Err(err),
        }
    }

    /// The pass of one schedule in `tx`, bounded by the tick's timeouts.
    async fn tick_locked(
        &self,
        tx: &mut sqlx::PgConnection,
        entry: &Entry,
        schedule: &Schedule,
    ) -> Result<Vec<i64>> {
        let registered = sql::cron_register(
            &self.cron_table,
            &self.job_table,
            &entry.name,
            schedule.expression(),
            schedule.time_zone(),
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("cron"))?;
        // A schedule seen for the first time starts from now, whatever the
        // clock reads by the next statement: this pass only registers it.
        if registered.is_some_and(|r| r.get::<bool, _>("registered")) {
            return Ok(Vec::new());
        }
        // Locks the schedule's row: concurrent schedulers wait here, then see
        // the tick this one advanced to.
        let row = sql::cron_state(&self.cron_table, &self.job_table, &entry.name)
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("cron"))?;
        let (last, now) = (micros(row.get("last_tick")), micros(row.get("now")));
        // A tick is on time if a running scheduler could have found it now.
        let on_time = self.interval + Duration::from_secs(60);
        let (due, advance) = due_ticks(schedule, entry.backfill, last, now, on_time);
        let Some(advance) = advance else {
            // Nothing came due: the commit releases the row lock.
            return Ok(Vec::new());
        };
        if due.is_empty() {
            tracing::info!(schedule = %entry.name, tick = %advance, "skipped ticks missed while no scheduler ran");
        }
        let jobs: Vec<NewJob> = due.iter().map(|d| self.job_for(entry, d)).collect();
        // The enqueue's lock waits keep the tick's timeout: a keyed job whose
        // holder a transaction locks (a transactional handler that wrote its
        // progress) would otherwise hold up every schedule after this one.
        let ids = match self.enqueue(tx, entry, &jobs).await {
            Ok(ids) => ids,
            Err(Error::Database { source, .. }) if crate::error::has_sqlstate(&source, "55P03") => {
                return Err(Error::Database {
                    op: ENQUEUE_LOCK_NOT_GRANTED,
                    source,
                });
            }
            Err(err) => return Err(err),
        };
        sql::cron_advance(
            &self.cron_table,
            &self.job_table,
            &entry.name,
            advance.timestamp_micros(),
            ids.last().copied(),
        )
        .execute(&mut *tx)
        .await
        .map_err(Error::db("cron"))?;
        Ok(ids)
    }

    /// Enqueues a pass's due jobs in `tx`; their ids.
    async fn enqueue(
        &self,
        tx: &mut sqlx::PgConnection,
        entry: &Entry,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        if jobs.is_empty() {
            Ok(Vec::new())
        } else if entry.job.key_value().is_some() {
            let mut ids = Vec::with_capacity(jobs.len());
            for job in jobs {
                ids.push(self.enqueuer.insert_one(&mut *tx, job).await?.id());
            }
            Ok(ids)
        } else {
            self.enqueuer.insert_many(&mut *tx, jobs).await
        }
    }

    /// The tick's job: a crontab entry's gets its payload with `_cron`.
    fn job_for(&self, entry: &Entry, due: &Due) -> NewJob {
        let (Some(payload), Some(column)) = (&entry.payload, &self.payload_column) else {
            return entry.job.clone();
        };
        let mut payload = payload.clone();
        payload.insert(
            "_cron".to_owned(),
            json!({
                "ts": due.at.to_rfc3339_opts(SecondsFormat::Secs, true),
                "backfilled": due.backfilled,
            }),
        );
        entry
            .job
            .clone()
            .json(column.clone(), Value::Object(payload))
    }
}

/// How long a pass waits for a schedule's row another scheduler holds (a
/// tick takes milliseconds; one held longer is paused or stuck).
const TICK_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// The operation of an enqueue whose lock was not granted within
/// [`TICK_LOCK_TIMEOUT`]: told apart from a schedule's row held elsewhere.
const ENQUEUE_LOCK_NOT_GRANTED: &str = "cron enqueue";

/// How long a tick's transaction may sit idle before the server ends its
/// session, releasing the schedule's row (a scheduler stopped mid-tick).
const TICK_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

fn micros(value: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(value).unwrap_or_default()
}
