//! `DbJob`: a claimed job, with its transaction in transactional handling.

use std::fmt;

use sqlx::{PgConnection, Postgres, Transaction};
use workerutil::{Job, Lease, Record};

/// A job dequeued from a [`DbStore`](super::DbStore): the record and, in transactional
/// handling, the transaction that locks its row.
pub struct DbJob<R> {
    pub(super) record: R,
    pub(super) lease: Lease,
    pub(super) tx: Option<Transaction<'static, Postgres>>,
    /// What the errored mark writes to the payload column, if anything.
    pub(super) retry_payload: Option<serde_json::Value>,
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
    /// ([`StoreOptions::payload_column`](super::StoreOptions::payload_column))
    /// to `payload`, in the same fenced statement: the next attempt sees only
    /// what is left to do. [`BatchJobs`](crate::batch::BatchJobs) uses it to
    /// keep a batch's failed items. Ignored if the job completes or fails
    /// for good (a non-retryable error), and, with an error logged, if the
    /// store has no `payload_column`.
    pub fn retry_with_payload(&mut self, payload: serde_json::Value) {
        self.retry_payload = Some(payload);
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
}
