//! `Job<A>`: what a typed handler receives: the job's arguments, the claimed
//! job (its record, its transaction, its result) and what the worker gives
//! every running job (cancellation, the execution log).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

use serde::de::DeserializeOwned;
use sqlx::PgConnection;
use workerutil::{BoxError, ExecutionLogEntry, JobContext};

use super::{ArgsRecord, TypedJob};
use crate::error::{Error, Result};
use crate::store::{DbJob, DbStore};

/// One run of a typed job, as its [`JobHandler`](super::JobHandler) sees it.
///
/// `job.args` holds the arguments, read from the payload column. The rest is
/// the claimed [`DbJob`] (reached through `Deref`: `job.record()`,
/// `job.set_result(..)`) and the running job's context.
///
/// ```no_run
/// use dbworker::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Square { n: i64 }
/// impl JobArgs for Square { const KIND: &'static str = "square"; }
///
/// struct Squarer;
/// impl JobHandler for Squarer {
///     type Args = Square;
///
///     async fn handle(&self, mut job: Job<'_, Square>) -> Result<(), HandlerError> {
///         let n = job.args.n;
///         sqlx::query("INSERT INTO squares VALUES ($1, $1 * $1)")
///             .bind(n)
///             .persistent(false)
///             .execute(job.tx()?)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub struct Job<'a, A, R: ArgsRecord = TypedJob> {
    /// The job's arguments.
    pub args: A,
    job: &'a mut DbJob<R>,
    ctx: &'a JobContext<DbStore<R>>,
}

impl<A, R: ArgsRecord> std::fmt::Debug for Job<'_, A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.job.record().id())
            .field("kind", &self.job.record().kind())
            .field("lease", &self.ctx.lease())
            .finish_non_exhaustive()
    }
}

impl<'a, A, R: ArgsRecord> Job<'a, A, R> {
    pub(crate) fn new(args: A, job: &'a mut DbJob<R>, ctx: &'a JobContext<DbStore<R>>) -> Self {
        Job { args, job, ctx }
    }

    /// The job's id.
    pub fn id(&self) -> i64 {
        self.job.record().id()
    }

    /// The connection of the transaction that locks this job's row: what the
    /// handler writes here commits with the job's completion and is rolled
    /// back if the job does not complete. Only transactional handling (the
    /// default) has one; a store in heartbeat handling gets
    /// [`Error::InvalidOption`] naming the setting.
    ///
    /// Behind a transaction pooler (PgBouncer), run statements here unnamed:
    /// `sqlx::query(..).persistent(false)`.
    pub fn tx(&mut self) -> Result<&mut PgConnection> {
        self.job.tx().ok_or_else(|| Error::InvalidOption {
            field: "handling",
            reason: "this job has no transaction: the store runs jobs in heartbeat handling (StoreOptions::handling); write on the pool, or use transactional handling".into(),
        })
    }

    /// Fired when the job times out, is canceled or lost, or the worker
    /// stops: for blocking or spawned work that must notice.
    pub fn cancellation(&self) -> &tokio_util::sync::CancellationToken {
        self.ctx.cancellation()
    }

    /// Appends an entry to the job's execution log; returns its index, or
    /// `None` if this attempt no longer owns the job.
    pub async fn log(
        &self,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        self.ctx.log(entry).await
    }

    /// The results of the jobs this one waited for, by task name (see
    /// [`DbJob::upstream_results`]).
    pub async fn upstream_results(&mut self) -> Result<HashMap<String, serde_json::Value>> {
        self.job.upstream_results(self.ctx.store()).await
    }

    /// The result of the upstream task `task`, read as a `T` (see
    /// [`DbJob::upstream_result`]).
    pub async fn upstream_result<T: DeserializeOwned>(&mut self, task: &str) -> Result<Option<T>> {
        self.job.upstream_result(self.ctx.store(), task).await
    }

    /// The checkpoint the last attempt saved, read as a `T`; `None` on the
    /// first attempt (see [`DbJob::checkpoint`]).
    pub async fn checkpoint<T: DeserializeOwned>(&mut self) -> Result<Option<T>> {
        self.job.checkpoint(self.ctx.store()).await
    }

    /// Saves the checkpoint the next attempt resumes from; in transactional
    /// handling it commits with what the handler wrote so far (see
    /// [`DbJob::save_checkpoint`]).
    pub async fn save_checkpoint(&mut self, checkpoint: impl serde::Serialize) -> Result<()> {
        self.job.save_checkpoint(self.ctx.store(), checkpoint).await
    }

    /// Consumes the signal `name` this job waited for, read as a `T` (see
    /// [`DbJob::signal`]); to wait for one, return
    /// [`HandlerError::wait_for`](workerutil::HandlerError::wait_for).
    pub async fn signal<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>> {
        self.job.signal(self.ctx.store(), name).await
    }

    /// Reports the job's public progress with the next heartbeat, without a
    /// statement of its own (see [`DbJob::report_progress`]).
    pub fn report_progress(&mut self, progress: impl serde::Serialize) -> Result<()> {
        self.job.report_progress(self.ctx.store(), progress)
    }

    /// Sets the job's public progress (see [`DbJob::set_progress`]).
    pub async fn set_progress(&mut self, progress: impl serde::Serialize) -> Result<()> {
        self.job.set_progress(self.ctx.store(), progress).await
    }

    /// What the worker gives every running job: the store, the lease, the
    /// worker's name.
    pub fn context(&self) -> &JobContext<DbStore<R>> {
        self.ctx
    }
}

impl<A, R: ArgsRecord> Deref for Job<'_, A, R> {
    type Target = DbJob<R>;

    fn deref(&self) -> &DbJob<R> {
        self.job
    }
}

impl<A, R: ArgsRecord> DerefMut for Job<'_, A, R> {
    fn deref_mut(&mut self) -> &mut DbJob<R> {
        self.job
    }
}
