//! Every mark of a claimed job, each fenced by its lease: completion (with
//! the handler's result, in its transaction), errored and failed (through the
//! grouped marks in heartbeat handling), snoozed, requeued; and the
//! lost-connection path.
//!
//! A job whose own transaction connection died (a Postgres restart, a
//! terminated backend, a network cut) goes back to the queue instead of being
//! charged a failure: the handler did nothing wrong, and with the default retry
//! policy one such fault used to fail every in-flight job for good.
//!
//! The store cannot see the handler's error (marks take only a message), so it
//! asks the transaction itself: rolling it back fails when its connection is
//! gone. Then the job is requeued on the pool with `sql::requeue_lost` (counted
//! as a reset, like the resetter would, so a job that keeps killing its
//! connection still ends); if that fails too, the row stays `processing` with no
//! lock and the resetter requeues it after `stalled_max_age`.

use sqlx::Row;
use sqlx::postgres::{PgDatabaseError, PgSeverity};
use workerutil::{BoxError, JobState, Lease, Record, Retry};

use super::open::JobTx;
use super::{DbJob, DbStore};
use crate::error::{Error, Result};
use crate::message::refused_payload;
use crate::sql::{self, Mark, MarkKind};

/// Whether `err` means the connection is unusable, as opposed to a statement
/// that failed on a healthy connection.
pub(crate) fn is_connection_loss(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => {
            // Class 08: connection exception; 57P01-03: the server shut down or
            // terminated this backend. Any FATAL or PANIC ends the session too.
            let code_says = db
                .code()
                .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03"));
            let severity_says = db
                .try_downcast_ref::<PgDatabaseError>()
                .is_some_and(|e| matches!(e.severity(), PgSeverity::Fatal | PgSeverity::Panic));
            code_says || severity_says
        }
        _ => false,
    }
}

impl<R: Record> DbStore<R> {
    /// A refused result (too large, or holding a NUL) fails the job instead
    /// (and reports it).
    pub(super) async fn complete_job(
        &self,
        job: &mut DbJob<R>,
    ) -> std::result::Result<bool, BoxError> {
        if let Some(err) = job.result_refused.take() {
            self.mark_failure(job, MarkKind::Failed, &err.to_string(), None)
                .await?;
            return Err(err.into());
        }
        let result = job.result.take();
        let span = job.attempt_trace.clone();
        let Some(mut tx) = job.tx.take() else {
            return Ok(self
                .grouped(job.lease, MarkKind::Complete, "", None, result, span)
                .await?
                .is_some());
        };
        let statement = self.complete_statement(job.lease, result, span.as_deref());
        // The mark and the handler's writes commit together, or not at all.
        let done = match statement.execute(&mut tx).await {
            Ok(done) => done,
            Err(err) => {
                // The transaction is aborted: end it before any mark on the pool.
                if let Err(rollback) = tx.rollback().await {
                    tracing::warn!(record_id = job.lease.id, error = %rollback, "rollback of the handler's transaction failed");
                }
                return Err(self
                    .completion_failed("mark_complete", job.lease, err, span.as_deref())
                    .await);
            }
        };
        if done.rows_affected() != 1 {
            // No longer ours: the handler's writes must not land either.
            tx.rollback().await.map_err(Error::db("rollback"))?;
            return Ok(false);
        }
        if let Err(err) = tx.commit().await {
            return Err(self
                .completion_failed("commit", job.lease, err, span.as_deref())
                .await);
        }
        Ok(true)
    }

    /// Marks a claimed job errored or failed: through the grouped marks when
    /// it has no transaction (heartbeat handling), else fenced on the pool
    /// after rolling the handler's transaction back (`write_failure`).
    pub(super) async fn mark_failure(
        &self,
        job: &mut DbJob<R>,
        kind: MarkKind,
        message: &str,
        retry: Option<&Retry>,
    ) -> std::result::Result<Option<JobState>, BoxError> {
        let lease = job.lease;
        let payload = job
            .retry_payload
            .take()
            .filter(|_| kind == MarkKind::Errored);
        // A payload jsonb cannot store would fail the mark and strand the job:
        // it fails instead, saying why, and keeps the payload it had.
        let refused = payload.as_ref().and_then(|p| refused_payload(message, p));
        let (kind, message, payload) = match &refused {
            Some(refused) => (MarkKind::Failed, refused.as_str(), None),
            None => (kind, message, payload),
        };
        let hinted = crate::pooler::named_statement_hint(&self.pool, message);
        let message = hinted.as_deref().unwrap_or(message);
        // Taken back once the retry is written: a claim that passed the row
        // before then must not move the cursor past it (see store/cursor.rs).
        let requeued = |done: Option<JobState>| {
            if done.is_some() && kind == MarkKind::Errored {
                self.back_in_queue(lease.id);
            }
            done
        };
        if let Some(payload) = payload {
            return self
                .mark_errored_with_payload(job, message, retry, payload)
                .await
                .map(requeued);
        }
        if job.tx.is_none() {
            let span = job.attempt_trace.clone();
            return self
                .grouped(lease, kind, message, retry, None, span)
                .await
                .map(requeued);
        }
        let (id, token) = (job.lease.id, job.lease.token);
        let (op, statement) = match kind {
            MarkKind::Failed => (
                "mark_failed",
                sql::mark_failed(
                    &self.options,
                    id,
                    token,
                    message,
                    job.attempt_trace.as_deref(),
                ),
            ),
            _ => (
                "mark_errored",
                sql::mark_errored(
                    &self.options,
                    id,
                    token,
                    message,
                    &self.options.retry_rule(retry),
                    job.attempt_trace.as_deref(),
                ),
            ),
        };
        let done = self
            .write_failure(
                op,
                job.lease,
                job.tx.take(),
                statement,
                job.attempt_trace.as_deref(),
            )
            .await?;
        Ok(requeued(done))
    }

    /// The canceled mark of a job its handler canceled.
    pub(super) async fn cancel_job(
        &self,
        job: &mut DbJob<R>,
        message: &str,
    ) -> std::result::Result<bool, BoxError> {
        let lease = job.lease;
        let statement = sql::mark_canceled(
            &self.options,
            lease.id,
            lease.token,
            message,
            job.attempt_trace.as_deref(),
        );
        Ok(self
            .write_failure(
                "mark_canceled",
                lease,
                job.tx.take(),
                statement,
                job.attempt_trace.as_deref(),
            )
            .await?
            .is_some())
    }

    /// The errored mark that also rewrites the payload (item jobs): one fenced
    /// statement on the pool, after the handler's transaction is rolled back,
    /// in either handling mode (never grouped).
    pub(super) async fn mark_errored_with_payload(
        &self,
        job: &mut DbJob<R>,
        message: &str,
        retry: Option<&Retry>,
        payload: serde_json::Value,
    ) -> std::result::Result<Option<JobState>, BoxError> {
        let o = &self.options;
        let (lease, rule) = (job.lease, o.retry_rule(retry));
        let statement = match &o.payload_column {
            Some(column) => sql::mark_errored_with_payload(
                o,
                lease.id,
                lease.token,
                message,
                &rule,
                (column, payload),
                job.attempt_trace.as_deref(),
            ),
            None => {
                tracing::error!(store = %o.name, record_id = lease.id, "retry_with_payload needs the table's payload column (JobTableOptions::payload_column); the payload is left as it was");
                sql::mark_errored(
                    o,
                    lease.id,
                    lease.token,
                    message,
                    &rule,
                    job.attempt_trace.as_deref(),
                )
            }
        };
        let done = self
            .write_failure(
                "mark_errored",
                lease,
                job.tx.take(),
                statement,
                job.attempt_trace.as_deref(),
            )
            .await?;
        Ok(done)
    }

    /// The common completion, when `job` is one: heartbeat handling with the
    /// grouped writer, no transaction, no refused result and no last
    /// progress value waiting. The future awaits only the writer's answer.
    pub(super) fn grouped_completion<'s>(
        &'s self,
        job: &mut DbJob<R>,
    ) -> Option<impl Future<Output = std::result::Result<Option<JobState>, BoxError>> + use<'s, R>>
    {
        if job.tx.is_some()
            || job.result_refused.is_some()
            || self.pending_progress.holds(job.lease)
        {
            return None;
        }
        let result = job.result.take();
        let span = job.attempt_trace.as_deref();
        let lease = job.lease;
        self.to_writer(lease, MarkKind::Complete, "", None, result.as_ref(), span)
    }

    /// The mark handed to the grouped writer, when the store has one: a
    /// small future that awaits only the writer's answer (built before it,
    /// so it holds no borrowed argument).
    fn to_writer<'s>(
        &'s self,
        lease: Lease,
        kind: MarkKind,
        message: &str,
        retry: Option<&Retry>,
        result: Option<&serde_json::Value>,
        span: Option<&str>,
    ) -> Option<impl Future<Output = std::result::Result<Option<JobState>, BoxError>> + use<'s, R>>
    {
        let completer = self.completer.as_ref()?;
        let mark = Mark {
            id: lease.id,
            token: lease.token,
            kind,
            message: message.to_owned(),
            result: result.map(|r| r.to_string()).unwrap_or_default(),
            span: span.unwrap_or_default().to_owned(),
        };
        let rule = self.options.retry_rule(retry);
        // A completion its row refused (a trigger, a constraint) is a failed
        // completion, marked errored next by the worker, as in
        // transactional handling (`failed_completion.rs`).
        let completing = kind == MarkKind::Complete;
        Some(async move {
            completer
                .mark(mark, rule)
                .await
                .map_err(|failed| -> BoxError {
                    if completing && failed.own {
                        workerutil::Error::CompletionFailed(failed.into()).into()
                    } else {
                        failed.into()
                    }
                })
        })
    }

    /// A mark without a handler transaction: written with the next group in
    /// heartbeat handling, else (a transactional job whose transaction is
    /// already gone) on its own.
    pub(super) async fn grouped(
        &self,
        lease: Lease,
        kind: MarkKind,
        message: &str,
        retry: Option<&Retry>,
        result: Option<serde_json::Value>,
        span: Option<String>,
    ) -> std::result::Result<Option<JobState>, BoxError> {
        if let Some(mark) = self.to_writer(
            lease,
            kind,
            message,
            retry,
            result.as_ref(),
            span.as_deref(),
        ) {
            return mark.await;
        }
        let rule = self.options.retry_rule(retry);
        let (op, statement) = match kind {
            MarkKind::Complete => {
                let statement = self.complete_statement(lease, result, span.as_deref());
                let done = self.fenced_write("mark_complete", lease, None, statement);
                return Ok(done.await?.then_some(JobState::Completed));
            }
            MarkKind::Errored => (
                "mark_errored",
                sql::mark_errored(
                    &self.options,
                    lease.id,
                    lease.token,
                    message,
                    &rule,
                    span.as_deref(),
                ),
            ),
            MarkKind::Failed => (
                "mark_failed",
                sql::mark_failed(
                    &self.options,
                    lease.id,
                    lease.token,
                    message,
                    span.as_deref(),
                ),
            ),
        };
        Ok(self.write_failure(op, lease, None, statement, None).await?)
    }

    /// The completion of `lease`, with the handler's result if it set one
    /// and, on a table with traces, the attempt's `span`.
    pub(super) fn complete_statement(
        &self,
        lease: Lease,
        result: Option<serde_json::Value>,
        span: Option<&str>,
    ) -> sql::Statement {
        let o = &self.options;
        let span = span.filter(|_| o.traces);
        match (result, &o.result_column) {
            (Some(result), Some(column)) => {
                sql::mark_complete_with_result(o, lease.id, lease.token, (column, result), span)
            }
            _ if span.is_some() => sql::mark_complete(o, lease.id, lease.token, span),
            _ => o.per_job.mark_complete(lease.id, lease.token),
        }
    }

    /// Marks a claimed job failed without running it; returns whether the
    /// claim still owned it.
    pub(super) async fn fail_unstarted(&self, lease: Lease, message: &str) -> Result<bool> {
        let statement = sql::mark_failed(&self.options, lease.id, lease.token, message, None);
        Ok(self
            .write_failure("mark_failed", lease, None, statement, None)
            .await?
            .is_some())
    }

    /// Runs a fenced statement on the pool, after rolling back the handler's
    /// transaction (a failure is recorded outside it, without its writes).
    pub(crate) async fn fenced_write(
        &self,
        op: &'static str,
        lease: Lease,
        tx: Option<JobTx>,
        statement: sql::Statement,
    ) -> Result<bool> {
        if let Some(tx) = tx
            && let Err(err) = tx.discard().await
        {
            tracing::warn!(record_id = lease.id, error = %err, "rollback of the handler's transaction failed");
        }
        let done = statement.execute(&self.pool).await.map_err(Error::db(op))?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn snooze_job(
        &self,
        job: &mut DbJob<R>,
        delay: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        let statement = sql::snooze(
            &self.options,
            job.lease.id,
            job.lease.token,
            delay,
            job.attempt_trace.as_deref(),
        );
        let done = self
            .fenced_write("mark_snoozed", job.lease, job.tx.take(), statement)
            .await?;
        if done {
            // Behind the claim cursor once its delay is over.
            self.back_in_queue(job.lease.id);
        }
        Ok(done)
    }

    pub(super) async fn requeue_job(
        &self,
        job: &mut DbJob<R>,
    ) -> std::result::Result<bool, BoxError> {
        let span = job.attempt_trace.as_deref();
        let statement = sql::requeue(&self.options, job.lease.id, job.lease.token, span);
        let done = self
            .fenced_write("requeue", job.lease, job.tx.take(), statement)
            .await?;
        if done {
            self.back_in_queue(job.lease.id);
        }
        Ok(done)
    }

    /// Records a failure of a claimed job: rolls back the handler's transaction,
    /// then runs `statement` (a fenced `mark_errored` or `mark_failed`) on the
    /// pool, unless the transaction's connection turned out to be lost, in which
    /// case the job is requeued without counting a failure.
    pub(crate) async fn write_failure(
        &self,
        op: &'static str,
        lease: Lease,
        tx: Option<super::open::JobTx>,
        statement: sql::Statement,
        span: Option<&str>,
    ) -> Result<Option<JobState>> {
        if let Some(tx) = tx
            && let Err(err) = tx.discard().await
        {
            if is_connection_loss(&err) {
                return self.requeue_lost(lease, op, &err, span).await;
            }
            tracing::warn!(record_id = lease.id, error = %err, "rollback of the handler's transaction failed");
        }
        // Alone on the pool: written again if Postgres rolls it back as passing.
        let row = super::transient::again_if_transient(
            op,
            || statement.clone().fetch_optional(self.pool()),
            super::transient::is_transient,
        )
        .await
        .map_err(Error::db(op))?;
        row.map(|row| written_state(op, &row)).transpose()
    }
}

/// The state a fenced statement wrote (its `RETURNING ... AS state`).
pub(super) fn written_state(op: &'static str, row: &sqlx::postgres::PgRow) -> Result<JobState> {
    let state: String = row.try_get("state").map_err(Error::db(op))?;
    state
        .parse()
        .map_err(|e: workerutil::UnknownState| Error::InvalidOption {
            field: "state",
            reason: format!("{op} wrote a state this version does not know: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_and_protocol_errors_are_connection_losses() {
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert!(is_connection_loss(&sqlx::Error::Io(eof)));
        assert!(is_connection_loss(&sqlx::Error::Protocol("x".into())));
        assert!(!is_connection_loss(&sqlx::Error::RowNotFound));
        assert!(!is_connection_loss(&sqlx::Error::PoolTimedOut));
    }
}
