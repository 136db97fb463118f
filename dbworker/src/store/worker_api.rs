//! `impl workerutil::Store for DbStore`: what the worker calls, from the claim
//! to the last mark.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;
use workerutil::{
    BoxError, ExecutionLogEntry, HeartbeatResult, Lease, Record, Retry, Store, Wakeups,
    WorkerOptions,
};

use super::connection_loss::is_connection_loss;
use super::job_tx::JobTx;
use super::{DbConditions, DbJob, DbStore, Handling};
use crate::error::{Error, Result};
use crate::message::sanitize_log_entry;
use crate::sql;
use crate::sql::MarkKind;

#[async_trait]
impl<R: Record> Store for DbStore<R> {
    type Record = R;
    type Job = DbJob<R>;
    type Conditions = DbConditions;

    fn check_worker_options(
        &self,
        options: &WorkerOptions,
        claim_ahead: usize,
    ) -> std::result::Result<(), BoxError> {
        Ok(self.check_worker(options, claim_ahead)?)
    }

    /// A handler count ahead, in both modes: a buffered job holds no
    /// connection (transactional handling opens its transaction when it starts).
    fn default_claim_ahead(&self, num_handlers: usize) -> usize {
        num_handlers
    }

    /// Heartbeat handling keeps two claims in flight while the queue is busy;
    /// transactional handling one, since each claim in flight needs a
    /// connection beside those its jobs hold.
    fn default_concurrent_dequeues(&self) -> usize {
        match self.options.handling {
            Handling::Heartbeat => 2,
            Handling::Transactional => 1,
        }
    }

    fn wakeups(&self) -> Option<Wakeups> {
        self.wakeups.clone()
    }

    /// In transactional handling a job holds its transaction's connection
    /// until the mark commits; the pool is sized for one per handler.
    fn job_holds_resources(&self) -> bool {
        self.options.handling == Handling::Transactional
    }

    async fn queued_count(&self) -> std::result::Result<u64, BoxError> {
        let row = sql::queued_count(&self.options)
            .query()
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("queued_count"))?;
        Ok(u64::try_from(row.get::<i64, _>(0)).unwrap_or(0))
    }

    async fn dequeue(
        &self,
        hostname: &str,
        conditions: &DbConditions,
        limit: usize,
    ) -> std::result::Result<Vec<DbJob<R>>, BoxError> {
        let o = &self.options;
        // The claim reads the records itself, unless a view must be read after
        // the table's rows are claimed. Transactional handling locks each row
        // later, in the job's own task (`open`), so claims never wait for that.
        let with_record = o.view.is_none();
        let started = std::time::Instant::now();
        let mut claim_conditions = std::borrow::Cow::Borrowed(conditions.0.as_slice());
        // Forbidden flags are one more condition: each set of them names a
        // cursor of its own, so rows a set skipped are never behind the
        // cursor of a set that allows them.
        if let (Some(forbidden), Some(column)) = (&o.forbidden_flags, &o.flags_column) {
            let flags = forbidden.current().await;
            if !flags.is_empty() {
                claim_conditions
                    .to_mut()
                    .push(sql::not_flagged(o, column, &flags));
            }
        }
        // The conditions as text (values inlined) name their cursor.
        let cursor = self
            .cursor
            .as_ref()
            .map(|c| (c, sql::conditions_key(&claim_conditions)));
        let start = cursor
            .as_ref()
            .map(|(c, key)| c.start(key, &claim_conditions));
        if let Some(low) = start.and_then(|s| s.low) {
            claim_conditions
                .to_mut()
                .push(sql::claim_cursor_condition(o, low));
        }
        let claim = |limit: usize, mode| {
            let conditions = &claim_conditions;
            sql::claim_limited(o, hostname, conditions, limit.max(1), with_record, mode)
        };
        let rows = if sql::limited(o).is_some() {
            super::limited::claim(&self.pool, o, limit.max(1), claim).await?
        } else {
            claim(limit, sql::LimitedClaim::Serialized)
                .query()
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db("claim"))?
        };
        tracing::debug!(store = %o.name, limit, claimed = rows.len(), cursor = ?start.and_then(|s| s.low), took = ?started.elapsed(), "claimed");
        // The rows come back in id order (the cursor's condition for use). A
        // claim that a limit bound may have passed rows over: the cursor stays.
        let bound = sql::limited(o).is_some()
            && rows
                .iter()
                .any(|r| r.get::<Option<bool>, _>(sql::CLAIM_BOUND) != Some(false));
        let last = rows.iter().map(|r| r.get::<i64, _>(sql::RECORD_ID)).max();
        if let (Some((cursor, key)), Some(start), Some(last), false) = (&cursor, start, last, bound)
        {
            cursor.claimed_up_to(key, start, last);
        }
        let mut leases = Vec::with_capacity(rows.len());
        let mut opened: Vec<Result<Option<DbJob<R>>>> = Vec::with_capacity(rows.len());
        let mut claimed_rows = Vec::new();
        for row in rows {
            let lease = Lease {
                id: row.get(sql::RECORD_ID),
                token: row.get(sql::CLAIMED_TOKEN),
            };
            if row
                .get::<Option<bool>, _>(sql::CLAIMED_CANCEL)
                .unwrap_or(false)
            {
                // Canceled while it waited: record that instead of running it.
                let canceled = self
                    .fail_unstarted(lease, None, "job was canceled before it started")
                    .await;
                opened.push(canceled.map(|_| None));
            } else if with_record {
                claimed_rows.push((lease, row));
            } else {
                leases.push(lease);
            }
        }
        for (lease, row) in claimed_rows {
            opened.push(self.scan_or_fail(lease, Ok(Some(row)), None).await);
        }
        // One read for the whole batch, through the view.
        if !leases.is_empty() {
            let ids = leases.iter().map(|l| l.id).collect();
            match sql::select_records(o, ids)
                .query()
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => {
                    let mut by_id: HashMap<i64, PgRow> = rows
                        .into_iter()
                        .map(|r| (r.get::<i64, _>(sql::RECORD_ID), r))
                        .collect();
                    for lease in leases {
                        let row = Ok(by_id.remove(&lease.id));
                        opened.push(self.scan_or_fail(lease, row, None).await);
                    }
                }
                // Left processing: the resetter requeues them.
                Err(err) => opened.push(Err(Error::db("select_records")(err))),
            }
        }
        let mut jobs = Vec::with_capacity(opened.len());
        let mut first_error = None;
        // One bad row must not strand the others this call claimed.
        for result in opened {
            match result {
                Ok(Some(job)) => jobs.push(job),
                Ok(None) => {}
                Err(err) => {
                    tracing::error!(error = %err, "could not open a claimed job; the resetter will requeue it");
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) if jobs.is_empty() => Err(err.into()),
            _ => Ok(jobs),
        }
    }

    /// Transactional handling: begins the job's transaction and locks its row
    /// `FOR KEY SHARE`, if the claim still owns it. A lost connection puts the
    /// job back (counted as a reset) instead of failing it.
    async fn open(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        if self.options.handling != Handling::Transactional || job.tx.is_some() {
            return Ok(true);
        }
        let lease = job.lease;
        let locked = async {
            let mut tx = JobTx::begin(&self.pool, &self.kept).await?;
            let row = self
                .options
                .per_job
                .lock_claimed(lease.id, lease.token)
                .query()
                .fetch_optional(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(row.map(|_| tx))
        };
        match locked.await {
            Ok(Some(tx)) => {
                job.tx = Some(tx);
                Ok(true)
            }
            Ok(None) => {
                tracing::warn!(store = %self.options.name, record_id = lease.id, "claimed row was reset before it could be locked; not running it");
                Ok(false)
            }
            Err(err) if is_connection_loss(&err) => {
                self.requeue_lost(lease, "open", &err).await?;
                Ok(false)
            }
            Err(err) => Err(Error::db("open")(err).into()),
        }
    }

    async fn heartbeat(&self, leases: &[Lease]) -> std::result::Result<HeartbeatResult, BoxError> {
        let ids = leases.iter().map(|l| l.id).collect();
        let tokens = leases.iter().map(|l| l.token).collect();
        let rows = sql::heartbeat(&self.options, ids, tokens)
            .query()
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("heartbeat"))?;
        let mut result = HeartbeatResult::default();
        for row in rows {
            let id: i64 = row.get("id");
            result.known.push(id);
            if row.get::<Option<bool>, _>("cancel").unwrap_or(false) {
                result.cancel.push(id);
            }
        }
        Ok(result)
    }

    async fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let row = sql::log_append(&self.options, lease.id, lease.token, json)
            .query()
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("log_append"))?;
        match row {
            Some(r) => Ok(Some(
                usize::try_from(r.get::<i64, _>("len")).unwrap_or(1) - 1,
            )),
            None => self.log_refused(lease).await,
        }
    }

    async fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<bool, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let done = sql::log_update(&self.options, lease.id, lease.token, index, json)
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db("log_update"))?;
        Ok(done.rows_affected() == 1)
    }

    /// A refused result (too large, or holding a NUL) fails the job instead
    /// (and reports it).
    async fn mark_complete(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        if let Some(err) = job.result_refused.take() {
            self.mark_failure(job, MarkKind::Failed, &err.to_string(), None)
                .await?;
            return Err(err.into());
        }
        let result = job.result.take();
        let Some(mut tx) = job.tx.take() else {
            return self
                .batched(job.lease, MarkKind::Complete, "", None, result)
                .await;
        };
        let statement = self.complete_statement(job.lease, result);
        // The mark and the handler's writes commit together, or not at all.
        let done = match statement.query().execute(&mut *tx).await {
            Ok(done) => done,
            Err(err) => {
                return Err(self
                    .completion_failed("mark_complete", job.lease, err)
                    .await
                    .into());
            }
        };
        if done.rows_affected() != 1 {
            // No longer ours: the handler's writes must not land either.
            tx.rollback().await.map_err(Error::db("rollback"))?;
            return Ok(false);
        }
        if let Err(err) = tx.commit().await {
            return Err(self
                .completion_failed("commit", job.lease, err)
                .await
                .into());
        }
        Ok(true)
    }

    /// `retry` (a kind's policy) replaces the store's `max_num_retries` and
    /// `retry` in the mark's bound values; the job's `max_retries_column` still wins.
    async fn mark_errored(
        &self,
        job: &mut DbJob<R>,
        message: &str,
        retry: Option<&Retry>,
    ) -> std::result::Result<bool, BoxError> {
        Ok(self
            .mark_failure(job, MarkKind::Errored, message, retry)
            .await?)
    }

    async fn mark_failed(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        Ok(self
            .mark_failure(job, MarkKind::Failed, message, None)
            .await?)
    }

    async fn mark_snoozed(
        &self,
        job: &mut DbJob<R>,
        delay: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        let statement = sql::snooze(&self.options, job.lease.id, job.lease.token, delay);
        let done = self
            .fenced_write("mark_snoozed", job.lease, job.tx.take(), statement)
            .await?;
        if done {
            // Behind the claim cursor once its delay is over.
            self.back_in_queue(job.lease.id);
        }
        Ok(done)
    }

    async fn requeue(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        let statement = sql::requeue(&self.options, job.lease.id, job.lease.token);
        let done = self
            .fenced_write("requeue", job.lease, job.tx.take(), statement)
            .await?;
        if done {
            self.back_in_queue(job.lease.id);
        }
        Ok(done)
    }
}
