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
use workerutil::{Lease, Record, error_chain};

use crate::error::{Error, Result};
use crate::sql;
use crate::store::DbStore;

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
    /// Records a failure of a claimed job: rolls back the handler's transaction,
    /// then runs `statement` (a fenced `mark_errored` or `mark_failed`) on the
    /// pool, unless the transaction's connection turned out to be lost, in which
    /// case the job is requeued without counting a failure.
    pub(crate) async fn write_failure(
        &self,
        op: &'static str,
        lease: Lease,
        tx: Option<super::job_tx::JobTx>,
        statement: sql::Statement,
    ) -> Result<bool> {
        if let Some(tx) = tx
            && let Err(err) = tx.rollback().await
        {
            if is_connection_loss(&err) {
                return self.requeue_lost(lease, op, &err).await;
            }
            tracing::warn!(record_id = lease.id, error = %err, "rollback of the handler's transaction failed");
        }
        self.fenced_write(op, lease, None, statement).await
    }

    /// The completion (`op`: the mark or the commit) failed with `err`. If the
    /// transaction's connection was lost, nothing committed: requeue the job now
    /// rather than leave it to the resetter. Returns the error to report.
    pub(crate) async fn completion_failed(
        &self,
        op: &'static str,
        lease: Lease,
        err: sqlx::Error,
    ) -> Error {
        if is_connection_loss(&err) {
            // A commit that landed before the connection dropped left the row
            // `completed`: the fenced requeue then matches nothing.
            let _ = self.requeue_lost(lease, op, &err).await;
        }
        Error::db(op)(err)
    }

    /// Requeues (or, past `max_num_resets`, fails) a job whose transaction
    /// connection was lost, fenced by its lease. Logs what happened.
    pub(crate) async fn requeue_lost(
        &self,
        lease: Lease,
        op: &'static str,
        cause: &sqlx::Error,
    ) -> Result<bool> {
        let cause = error_chain(cause);
        let o = self.resolved();
        let message = format!(
            "{} (last time, the job's database connection was lost: {cause})",
            o.reset_failure_message
        );
        let row = sql::requeue_lost(o, lease.id, lease.token, &message)
            .query()
            .fetch_optional(self.pool())
            .await;
        match row {
            Ok(Some(row)) => {
                let state: String = row.get("state");
                tracing::warn!(
                    store = %o.name,
                    record_id = lease.id,
                    op,
                    error = %cause,
                    new_state = %state,
                    "the job's transaction connection was lost: put it back without counting a failure (counted as a reset)"
                );
                self.back_in_queue(lease.id);
                Ok(true)
            }
            Ok(None) => {
                tracing::warn!(store = %o.name, record_id = lease.id, op, error = %cause, "the job's transaction connection was lost, and the job is no longer ours");
                Ok(false)
            }
            Err(err) => {
                tracing::error!(store = %o.name, record_id = lease.id, op, error = %cause, requeue_error = %err, "the job's transaction connection was lost and the requeue failed; the resetter will requeue it");
                Err(Error::db("requeue_lost")(err))
            }
        }
    }
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
