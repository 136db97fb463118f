//! `impl workerutil::Store for DbStore`: what the worker calls, from the claim
//! to the last mark, each delegated to the file of its concept: the claim to
//! `dequeue.rs`, the transactional open to `open.rs`, heartbeats and execution
//! logs to `heartbeat.rs` and `logs.rs`, every mark to `marks.rs`.
use sqlx::Row;
use workerutil::{
    BoxError, ExecutionLogEntry, HeartbeatResult, JobState, Lease, Record, Retry, Store, Wakeups,
    WorkerOptions,
};

use std::time::Instant;

use super::observe::Outcome;
use super::{DbConditions, DbJob, DbStore, Handling};
use crate::error::Error;
use crate::sql;
use crate::sql::MarkKind;
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
        let started = Instant::now();
        let result = self.claim_jobs(hostname, conditions, limit).await;
        self.observe_dequeue(started, result)
    }

    async fn open(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        let started = Instant::now();
        let result = self.open_job(job).await;
        self.observe("open", started, result)
    }

    async fn heartbeat(&self, leases: &[Lease]) -> std::result::Result<HeartbeatResult, BoxError> {
        let started = Instant::now();
        let result = self.heartbeat_jobs(leases).await;
        self.observe("heartbeat", started, result.map(Beat))
            .map(|b| b.0)
    }

    async fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        self.append_log(lease, entry).await
    }

    async fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<bool, BoxError> {
        self.update_log(lease, index, entry).await
    }

    async fn mark_complete(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        // The common case awaits only the grouped writer's answer; the rest
        // is boxed, so the future each waiting completion holds stays small
        // (inline, 10 KB per job: with a thousand waiting, 10 MB of RSS).
        if let Some(grouped) = self.grouped_completion(job) {
            let started = Instant::now();
            let result = grouped.await.map(|state| state.is_some());
            return self.observe("complete", started, result);
        }
        Box::pin(self.complete_in_full(job)).await
    }

    /// `retry` (a kind's policy) replaces the store's `max_num_retries` and
    /// `retry` in the mark's bound values; the job's `max_retries_column` still wins.
    async fn mark_errored(
        &self,
        job: &mut DbJob<R>,
        message: &str,
        retry: Option<&Retry>,
    ) -> std::result::Result<Option<JobState>, BoxError> {
        self.last_progress(job, false).await;
        let started = Instant::now();
        let result = self
            .mark_failure(job, MarkKind::Errored, message, retry)
            .await;
        self.observe("errored", started, result)
    }

    async fn mark_failed(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        self.last_progress(job, false).await;
        let started = Instant::now();
        let result = self
            .mark_failure(job, MarkKind::Failed, message, None)
            .await
            .map(|state| state.is_some());
        self.observe("failed", started, result)
    }

    /// One fenced statement on the pool, after the handler's transaction is
    /// rolled back, in either handling mode (never grouped: rare).
    async fn mark_canceled(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        self.last_progress(job, false).await;
        let started = Instant::now();
        let result = self.cancel_job(job, message).await;
        self.observe("canceled", started, result)
    }

    async fn mark_snoozed(
        &self,
        job: &mut DbJob<R>,
        delay: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        self.last_progress(job, false).await;
        let started = Instant::now();
        let result = self.snooze_job(job, delay).await;
        self.observe("snoozed", started, result)
    }

    /// The row locked first, then the mailbox read, then the mark, in the
    /// handler's transaction or one of its own (see `store/signals.rs`).
    async fn mark_waiting(
        &self,
        job: &mut DbJob<R>,
        signal: &str,
        timeout: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        // The wait commits the handler's transaction (its writes, a signal
        // it consumed): the last progress goes with it, not rolled back. A
        // table without signals snoozes instead, rolling it back: the last
        // progress is written outside it.
        let commits = self.options.signals.is_some();
        self.last_progress(job, commits).await;
        let started = Instant::now();
        let result = self.wait_job(job, signal, timeout).await;
        self.observe("waiting", started, result)
    }

    async fn requeue(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        self.last_progress(job, false).await;
        let started = Instant::now();
        let result = self.requeue_job(job).await;
        self.observe("requeue", started, result)
    }
}

/// A heartbeat's answer, counted as `ok` (what it found is in its own fields).
struct Beat(HeartbeatResult);

impl Outcome for Beat {
    fn label(&self) -> &'static str {
        "ok"
    }
}

impl<R: Record> DbStore<R> {
    /// [`Store::mark_complete`] beyond the grouped common case: a refused
    /// result, a last progress value, the job's own transaction.
    async fn complete_in_full(&self, job: &mut DbJob<R>) -> std::result::Result<bool, BoxError> {
        // A refused result fails the job instead (its transaction rolled back).
        let completing = job.result_refused.is_none();
        self.last_progress(job, completing).await;
        let started = Instant::now();
        let result = self.complete_job(job).await;
        self.observe("complete", started, result)
    }
}
