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
