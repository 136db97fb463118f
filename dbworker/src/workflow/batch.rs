//! Batches: N jobs and callback jobs that run once when all of them have
//! completed, when one has failed for good, or when all have ended, built on
//! the workflows' dependency edges.

use sqlx::{PgConnection, PgPool, Row};

use super::Workflows;
use crate::enqueue::{GraphTask, NewJob};
use crate::error::{Error, Result};
use crate::sql::{self, BATCH_CALLBACKS};
use crate::table::JobTable;

/// A batch of jobs with callback jobs, enqueued all at once by
/// [`Batches::enqueue`]. Each callback is a dependent of every job of the
/// batch, so it waits (`pending`) and is released by the trigger of
/// `dbworker migration --workflows`, in the transaction of the write that
/// decides it:
///
/// - [`on_success`](Batch::on_success) runs once every job has completed; the
///   first job to fail or be canceled cancels it (edges under
///   [`DependencyPolicy::Cancel`](crate::enqueue::DependencyPolicy::Cancel)).
/// - [`on_failure`](Batch::on_failure) runs once, at the first job that fails
///   for good (`failed`), however many fail; it is canceled when every job has
///   ended without one failing (edges under the policy `on_failure`).
/// - [`on_complete`](Batch::on_complete) runs once every job has ended,
///   whatever the outcome (edges under
///   [`DependencyPolicy::Ignore`](crate::enqueue::DependencyPolicy::Ignore)).
///
/// ```
/// use dbworker::{NewJob, workflow::Batch};
/// let batch = Batch::new()
///     .jobs((0..3).map(|n| NewJob::new().json("payload", serde_json::json!({"n": n}))))
///     .on_success(NewJob::new().json("payload", serde_json::json!({"notify": "done"})))
///     .on_failure(NewJob::new().json("payload", serde_json::json!({"notify": "failed"})));
/// assert_eq!(batch.len(), 3);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Batch {
    jobs: Vec<NewJob>,
    on_success: Option<NewJob>,
    on_failure: Option<NewJob>,
    on_complete: Option<NewJob>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a job (no key, no [`NewJob::after`]).
    pub fn job(mut self, job: NewJob) -> Batch {
        self.jobs.push(job);
        self
    }

    /// Adds jobs.
    pub fn jobs(mut self, jobs: impl IntoIterator<Item = NewJob>) -> Batch {
        self.jobs.extend(jobs);
        self
    }

    /// The job run once every job of the batch has completed.
    pub fn on_success(mut self, job: NewJob) -> Batch {
        self.on_success = Some(job);
        self
    }

    /// The job run once, when the first job of the batch fails for good.
    pub fn on_failure(mut self, job: NewJob) -> Batch {
        self.on_failure = Some(job);
        self
    }

    /// The job run once every job of the batch has ended (completed, failed
    /// or canceled).
    pub fn on_complete(mut self, job: NewJob) -> Batch {
        self.on_complete = Some(job);
        self
    }

    /// The number of jobs, callbacks aside.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the batch has no job.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    fn callbacks(&self) -> [(&'static str, Option<&NewJob>, &'static str); 3] {
        // Names as in `sql::BATCH_CALLBACKS`, with each one's edge policy.
        [
            (BATCH_CALLBACKS[0], self.on_success.as_ref(), "cancel"),
            (BATCH_CALLBACKS[1], self.on_failure.as_ref(), "on_failure"),
            (BATCH_CALLBACKS[2], self.on_complete.as_ref(), "ignore"),
        ]
    }
}

/// What [`Batches::enqueue`] inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueuedBatch {
    /// The batch's id: the `workflow_id` column of its jobs and callbacks,
    /// which is how a callback finds its batch.
    pub id: i64,
    /// The jobs' ids, in the order they were added.
    pub jobs: Vec<i64>,
    /// The success callback's job id.
    pub on_success: Option<i64>,
    /// The failure callback's job id.
    pub on_failure: Option<i64>,
    /// The completion callback's job id.
    pub on_complete: Option<i64>,
}

/// A batch's jobs counted by state, from [`Batches::counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BatchCounts {
    /// Jobs in the batch, callbacks aside.
    pub total: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Jobs failed for good.
    pub failed: u64,
    /// Jobs canceled.
    pub canceled: u64,
}

impl BatchCounts {
    /// Jobs not yet ended (queued, errored, processing).
    pub fn unfinished(&self) -> u64 {
        self.total - self.completed - self.failed - self.canceled
    }
}

/// Enqueues [`Batch`]es into a job table with workflows (`dbworker migration
/// --workflows`) and counts their jobs. A batch is a workflow whose tasks are
/// its jobs and callbacks, so [`Workflows::status`] and
/// [`Workflows::cancel`] take its id too.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::NewJob;
/// use dbworker::workflow::{Batch, Batches};
/// let jobs = dbworker::JobTable::new(&pool, dbworker::JobTableOptions::detected("jobs")).await?;
/// let batches = Batches::new(&pool, &jobs).await?;
/// let batch = batches
///     .enqueue(&Batch::new().job(NewJob::new()).job(NewJob::new()).on_complete(NewJob::new()))
///     .await?;
/// // In the callback's handler, with the batch id read from its `workflow_id`:
/// let counts = batches.counts(batch.id).await?;
/// # let _ = counts; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Batches {
    pool: PgPool,
    workflows: Workflows,
}

impl Batches {
    /// Batches in `table`, which must have workflows, as [`Workflows::new`].
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Batches> {
        Ok(Batches {
            pool: pool.clone(),
            workflows: Workflows::new(pool, table).await?,
        })
    }

    /// Enqueues `batch` on the pool, all or nothing; see
    /// [`enqueue_in`](Self::enqueue_in).
    pub async fn enqueue(&self, batch: &Batch) -> Result<EnqueuedBatch> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.enqueue_in(&mut conn, batch).await
    }

    /// Enqueues `batch` on the caller's connection or inside its transaction
    /// (a savepoint there), all or nothing: the jobs `queued`, the callbacks
    /// `pending` with one edge to each job. A batch needs at least one job.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        batch: &Batch,
    ) -> Result<EnqueuedBatch> {
        if batch.jobs.is_empty() {
            return Err(Error::InvalidOption {
                field: "batch",
                reason: "a batch needs at least one job".into(),
            });
        }
        let names: Vec<String> = (0..batch.jobs.len()).map(|i| format!("job-{i}")).collect();
        let mut graph: Vec<GraphTask<'_>> = batch
            .jobs
            .iter()
            .zip(&names)
            .map(|(job, name)| GraphTask {
                name,
                job,
                after: Vec::new(),
            })
            .collect();
        let callbacks = batch.callbacks();
        for (name, job, policy) in callbacks {
            if let Some(job) = job {
                graph.push(GraphTask {
                    name,
                    job,
                    after: (0..batch.jobs.len()).map(|i| (i, policy)).collect(),
                });
            }
        }
        let (id, ids) = self.workflows.enqueuer.insert_graph(conn, &graph).await?;
        let mut callback_ids = ids[batch.jobs.len()..].iter().copied();
        let mut next = |present: bool| present.then(|| callback_ids.next()).flatten();
        let (on_success, on_failure, on_complete) = (
            next(callbacks[0].1.is_some()),
            next(callbacks[1].1.is_some()),
            next(callbacks[2].1.is_some()),
        );
        Ok(EnqueuedBatch {
            id,
            jobs: ids[..batch.jobs.len()].to_vec(),
            on_success,
            on_failure,
            on_complete,
        })
    }

    /// The batch's jobs counted by state (callbacks aside); all zero if no
    /// job has this id. Exact once the batch has ended (in an `on_success` or
    /// `on_complete` callback); in an `on_failure` callback, the jobs still
    /// running count as unfinished.
    pub async fn counts(&self, batch_id: i64) -> Result<BatchCounts> {
        let rows = sql::batch_counts(&self.workflows.table, batch_id)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("batch_counts"))?;
        let mut counts = BatchCounts::default();
        for r in rows {
            let n = u64::try_from(r.get::<i64, _>("count")).unwrap_or(0);
            counts.total += n;
            match r.get::<String, _>("state").as_str() {
                "completed" => counts.completed += n,
                "failed" => counts.failed += n,
                "canceled" => counts.canceled += n,
                _ => {}
            }
        }
        Ok(counts)
    }
}
