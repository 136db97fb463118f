//! A completion that could not be written, and the jobs put back through
//! no fault of their own. A failure of the job's own rows ([`is_rows_own`]:
//! a deferred constraint, a trigger) is answered with
//! `workerutil::Error::CompletionFailed`, and the worker marks the job
//! errored under its own retry policy; any other failure (a lost
//! connection, a deadlock, a timeout) puts the job back, counted as a reset
//! so one that recurs still ends, and is answered with
//! `workerutil::Error::CompletionNotWritten`, saying what was written.

use workerutil::{BoxError, JobState, Lease, Record, error_chain};

use super::DbStore;
use super::marks::{is_connection_loss, written_state};
use crate::error::{Error, Result};
use crate::sql;

/// Whether the database refused a statement because of the rows it touched:
/// bad data (class 22), a constraint (class 23), an application's PL/pgSQL
/// raising (class P0: a trigger, a view's function), or a transaction the
/// handler itself left aborted (25P02). Such an error is the job's own: run
/// again, the same row fails the same way. Anything else (a timeout, a
/// missing grant or relation, a read-only server, a lost connection) is not.
pub(crate) fn is_rows_own(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|c| {
            c.starts_with("22") || c.starts_with("23") || c.starts_with("P0") || c == "25P02"
        })
}

impl<R: Record> DbStore<R> {
    /// The completion (`op`: the mark or the commit) failed with `err`; its
    /// transaction is over and nothing committed. An error of the job's own
    /// rows ([`is_rows_own`]: a deferred constraint, a trigger) answers
    /// [`workerutil::Error::CompletionFailed`], so the worker marks it
    /// errored with that error under the job's own retry policy and reports
    /// the attempt as errored. Any other (a lost connection, a deadlock, a
    /// timeout) is not the job's: it is put back at once, counted as a reset
    /// and not as a failure, fenced, on the pool; once put back, the answer
    /// is [`workerutil::Error::CompletionNotWritten`] with the state written
    /// (the worker reports the attempt interrupted, or errored past the
    /// reset limit). Returns the error to answer with.
    pub(crate) async fn completion_failed(
        &self,
        op: &'static str,
        lease: Lease,
        err: sqlx::Error,
        span: Option<&str>,
    ) -> BoxError {
        let requeued = if is_rows_own(&err) {
            let cause = Error::db(op)(err);
            return workerutil::Error::CompletionFailed(cause.into()).into();
        } else if is_connection_loss(&err) {
            // A commit that landed before the connection dropped left the row
            // `completed`: the fenced requeue then matches nothing.
            self.requeue_lost(lease, op, &err, span).await
        } else {
            // A deadlock, a serialization failure, a timeout, the server's
            // trouble: not the job's. Counted as a reset, so one that recurs
            // every time ends at `max_num_resets` instead of looping.
            let why = if super::transient::is_transient(&err) {
                "completing the job hit a deadlock or a serialization failure"
            } else {
                "completing the job failed for a reason not its own"
            };
            self.requeue_counted(lease, op, &err, why, span).await
        };
        let state = requeued.ok().flatten();
        let source = Error::db(op)(err).into();
        workerutil::Error::CompletionNotWritten { state, source }.into()
    }

    /// Requeues (or, past `max_num_resets`, fails) a job whose transaction
    /// connection was lost, fenced by its lease. Logs what happened.
    pub(crate) async fn requeue_lost(
        &self,
        lease: Lease,
        op: &'static str,
        cause: &sqlx::Error,
        span: Option<&str>,
    ) -> Result<Option<JobState>> {
        let why = "the job's database connection was lost";
        self.requeue_counted(lease, op, cause, why, span).await
    }

    /// Requeues (or, past `max_num_resets`, fails) a job that met `cause`
    /// through no fault of its own (`why`), counted as a reset and not as a
    /// failure, fenced by its lease. Logs what happened.
    pub(super) async fn requeue_counted(
        &self,
        lease: Lease,
        op: &'static str,
        cause: &sqlx::Error,
        why: &str,
        span: Option<&str>,
    ) -> Result<Option<JobState>> {
        let cause = error_chain(cause);
        let o = self.resolved();
        let message = format!("{} (last time, {why}: {cause})", o.reset_failure_message);
        let row = sql::requeue_lost(o, lease.id, lease.token, (&message, why), span)
            .fetch_optional(self.pool())
            .await;
        match row {
            Ok(Some(row)) => {
                let state = written_state("requeue_lost", &row)?;
                tracing::warn!(
                    store = %o.name,
                    record_id = lease.id,
                    op,
                    error = %cause,
                    new_state = %state,
                    why,
                    "put the job back without counting a failure (counted as a reset)"
                );
                self.back_in_queue(lease.id);
                Ok(Some(state))
            }
            Ok(None) => {
                tracing::warn!(store = %o.name, record_id = lease.id, op, error = %cause, why, "the job is no longer ours to put back");
                Ok(None)
            }
            Err(err) => {
                tracing::error!(store = %o.name, record_id = lease.id, op, error = %cause, why, requeue_error = %err, "the requeue failed; the resetter will requeue it");
                Err(Error::db("requeue_lost")(err))
            }
        }
    }
}
