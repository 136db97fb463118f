//! `DbJob`: a claimed job, with its transaction in transactional handling.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, Row};
use workerutil::{Job, Lease, Record};

use super::DbStore;
use crate::error::{Error, from_json, to_json};
use crate::sql;

/// A job dequeued from a [`DbStore`](super::DbStore): the record and, in transactional
/// handling, the transaction that locks its row.
pub struct DbJob<R> {
    pub(super) record: R,
    pub(super) lease: Lease,
    pub(super) tx: Option<super::open::JobTx>,
    /// What the errored mark writes to the payload column, if anything.
    pub(super) retry_payload: Option<serde_json::Value>,
    /// What the completion writes to the result column, if anything.
    pub(super) result: Option<serde_json::Value>,
    /// Why a result was refused (its size, a NUL character): the job fails
    /// with it instead of completing.
    pub(super) result_refused: Option<Error>,
    /// The store's `max_result_bytes`, when it has a result column.
    pub(super) result_cap: Option<usize>,
    /// The numbers of this attempt's progress writes, above the row's
    /// `progress_seq` its claim read.
    pub(super) numbers: super::progress::Numbers,
    /// The job's trace as its claim read it (a table with traces).
    pub(super) trace: Option<crate::trace::JobTrace>,
    /// The span this attempt runs under (`traceparent`), once tied to the
    /// job's trace: its mark records it for the next attempt.
    pub(super) attempt_trace: Option<String>,
    /// This attempt's span (a table with traces): a signal it consumes adds
    /// a link to its sender.
    pub(super) attempt_span: Option<tracing::Span>,
    /// Where the heartbeat finds this attempt's span (a table with traces):
    /// written once, so a worker killed before its mark still leaves it.
    pub(super) unbeaten: Option<super::heartbeat::Unbeaten>,
    /// What its claim saw of the store's pauses (`paused.rs`).
    pub(super) claimed: super::paused::AtClaim,
    /// The last progress report, written in the job's transaction for its
    /// completion: kept until that commits, so a failed commit's errored
    /// mark writes it again.
    pub(super) uncommitted_progress: Option<serde_json::Value>,
}

impl<R: fmt::Debug> fmt::Debug for DbJob<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbJob")
            .field("record", &self.record)
            .field("lease", &self.lease)
            .field("transactional", &self.tx.is_some())
            .finish()
    }
}

impl<R> DbJob<R> {
    /// The record.
    pub fn record(&self) -> &R {
        &self.record
    }

    /// The connection of the transaction that locks this job's row (transactional
    /// handling only). What the handler writes here commits together with the
    /// job's completion, and is rolled back if the job does not complete.
    ///
    /// The transaction is `READ COMMITTED`; keep it so (a stricter level would make
    /// the final mark fail on the concurrent heartbeat updates).
    pub fn tx(&mut self) -> Option<&mut PgConnection> {
        self.tx.as_deref_mut()
    }

    /// If this attempt ends errored, its mark also sets the job's payload
    /// ([`JobTableOptions::payload_column`](crate::JobTableOptions::payload_column))
    /// to `payload`, in the same fenced statement: the next attempt sees only
    /// what is left to do. [`ItemJobs`](crate::items::ItemJobs) uses it to
    /// keep an item job's failed items. Ignored if the job completes or fails
    /// for good (a non-retryable error), and, with an error logged, if the
    /// store's table has no `payload_column`.
    pub fn retry_with_payload(&mut self, payload: serde_json::Value) {
        self.retry_payload = Some(payload);
    }

    /// The result this attempt's completion stores in the job's result column
    /// ([`JobTableOptions::result_column`](crate::JobTableOptions::result_column)),
    /// in the same statement (and, in transactional handling, the same
    /// transaction) as the completion: jobs that waited for this one read it
    /// with [`DbJob::upstream_results`].
    /// Written only if the job completes; a later call replaces it.
    ///
    /// A result larger than `StoreOptions::max_result_bytes` (as JSON text) is
    /// refused with [`Error::ResultTooLarge`], and the job then fails with that
    /// message instead of completing, whatever the handler returns. So is a
    /// result holding a NUL character (U+0000) in a key or a string, which
    /// `jsonb` cannot store ([`Error::NulCharacter`], naming where it is).
    /// Without a result column the call is refused ([`Error::InvalidOption`]).
    ///
    /// The result is any `Serialize` value (a `serde_json::Value`, or a type
    /// of yours that [`upstream_result`](Self::upstream_result) reads back);
    /// one that does not serialize (a map with non-string keys) is refused
    /// with [`Error::Json`], and the job fails with it too.
    ///
    /// ```no_run
    /// # use dbworker::{DbJob, DbStore};
    /// # use workerutil::{HandlerError, JobContext};
    /// # async fn handle(job: &mut DbJob<i64>) -> Result<(), HandlerError> {
    /// job.set_result(serde_json::json!({ "rows": 42 }))?;
    /// Ok(())
    /// # }
    /// ```
    pub fn set_result(&mut self, result: impl Serialize) -> Result<(), Error> {
        let Some(cap) = self.result_cap else {
            return Err(Error::InvalidOption {
                field: "result_column",
                reason: "DbJob::set_result needs the table's result column (JobTableOptions::result_column; dbworker migration --results adds `result`)".into(),
            });
        };
        let what = || "cannot write the job's result".to_owned();
        let result = match to_json(&result, what) {
            Ok(result) => result,
            Err(err) => {
                // Kept for the mark (Error is not Clone): the job fails with it.
                self.result_refused = to_json(&result, what).err();
                self.result = None;
                return Err(err);
            }
        };
        let bytes = result.to_string().len();
        let refused = || match crate::message::nul_path(&result) {
            _ if bytes > cap => Some(Error::ResultTooLarge { bytes, cap }),
            Some(path) => Some(Error::NulCharacter {
                what: format!("the job's result (at {path})"),
            }),
            None => None,
        };
        if let Some(err) = refused() {
            // Kept for the mark (Error is not Clone): the job fails with it.
            self.result_refused = refused();
            self.result = None;
            return Err(err);
        }
        self.result = Some(result);
        self.result_refused = None;
        Ok(())
    }

    /// The results of the jobs this one waited for ([`Workflow`](crate::workflow::Workflow)
    /// tasks named in its `after`, or [`NewJob::after`](crate::NewJob::after)
    /// ids), keyed by their task name (a job outside a workflow: its id as
    /// text). A job that completed without a result maps to `null`; one that
    /// did not complete (an `ignore_failed` edge) is left out; one whose row
    /// is gone (deleted by hand) is [`Error::UpstreamGone`], naming it, rather
    /// than a map that looks complete (the purger keeps a completed job while
    /// a dependent has not finished). Reads through
    /// this job's transaction in transactional handling, else on the store's
    /// pool. Needs a table from `dbworker migration --workflows --results`
    /// whose `JobTable` names its `result_column` (and so, checked by
    /// `JobTable::new`, has `upstream_ids`, where dependents record the jobs
    /// they wait for).
    ///
    /// ```no_run
    /// # use dbworker::{DbJob, DbStore};
    /// # #[derive(Debug)] struct Job { id: i64 }
    /// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
    /// # async fn handle(job: &mut DbJob<Job>, store: &DbStore<Job>) -> Result<(), dbworker::Error> {
    /// let upstream = job.upstream_results(store).await?;
    /// let rows = upstream["extract"]["rows"].as_i64();
    /// # Ok(()) }
    /// ```
    pub async fn upstream_results(
        &mut self,
        store: &DbStore<R>,
    ) -> Result<HashMap<String, serde_json::Value>, Error>
    where
        R: Record,
    {
        let o = store.resolved();
        let Some(column) = &o.result_column else {
            return Err(Error::InvalidOption {
                field: "result_column",
                reason: "DbJob::upstream_results needs the table's result column (JobTableOptions::result_column)".into(),
            });
        };
        let statement = sql::upstream_results(o, column, self.lease.id);
        let rows = match self.tx.as_mut() {
            Some(tx) => statement.fetch_all(tx).await,
            None => statement.fetch_all(store.pool()).await,
        }
        .map_err(Error::db("upstream_results"))?;
        let gone: Vec<i64> = rows
            .iter()
            .filter(|r| r.get::<bool, _>("gone"))
            .map(|r| r.get("up"))
            .collect();
        if !gone.is_empty() {
            return Err(Error::UpstreamGone {
                job: self.lease.id,
                ids: gone,
            });
        }
        Ok(rows
            .iter()
            .filter(|r| r.get::<bool, _>("completed"))
            .map(|r| {
                let result: Option<serde_json::Value> = r.get("result");
                (r.get("name"), result.unwrap_or(serde_json::Value::Null))
            })
            .collect())
    }

    /// The result of the upstream job `task` (a task name, or an id as
    /// text: the keys of [`upstream_results`](Self::upstream_results)),
    /// read as a `T`. `None` when no such upstream job completed. A result
    /// that does not fit `T` is [`Error::Json`], naming the task and the
    /// path of the first mismatch; an upstream that completed without a
    /// result is JSON `null` (read it as an `Option`).
    ///
    /// ```no_run
    /// # use dbworker::{DbJob, DbStore};
    /// # #[derive(Debug)] struct Job { id: i64 }
    /// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Extracted { rows: i64, file: String }
    ///
    /// # async fn handle(job: &mut DbJob<Job>, store: &DbStore<Job>) -> Result<(), dbworker::Error> {
    /// let extracted: Option<Extracted> = job.upstream_result(store, "extract").await?;
    /// # Ok(()) }
    /// ```
    pub async fn upstream_result<T: DeserializeOwned>(
        &mut self,
        store: &DbStore<R>,
        task: &str,
    ) -> Result<Option<T>, Error>
    where
        R: Record,
    {
        let Some(result) = self.upstream_results(store).await?.remove(task) else {
            return Ok(None);
        };
        from_json(&result, || {
            format!("cannot read the result of upstream task {task:?}")
        })
        .map(Some)
    }
}

impl<R: Record> Job for DbJob<R> {
    type Record = R;

    fn record(&self) -> &R {
        &self.record
    }

    fn lease(&self) -> Lease {
        self.lease
    }

    fn abandon(&mut self) {
        if let Some(tx) = &mut self.tx {
            tx.abandon();
        }
    }

    fn trace_attempt(&mut self, span: &tracing::Span) {
        if let Some(trace) = &self.trace {
            self.attempt_trace = crate::trace::link_attempt(span, trace);
            self.attempt_span = Some(span.clone());
            if let (Some(unbeaten), Some(own)) = (&self.unbeaten, &self.attempt_trace) {
                unbeaten.put(own.clone());
            }
        }
    }
}
