//! A consumer's batch (`ConsumerBatch`, what the handler gets) and the claimed
//! job that carries it with its transaction (`LogJob`).

use std::fmt;

use sqlx::{PgConnection, Postgres, Transaction};
use workerutil::{Lease, Record};

use super::books::Slot;

/// One consumer's batch: what the handler gets.
#[derive(Debug)]
#[non_exhaustive]
pub struct ConsumerBatch<E> {
    /// The consumer's name.
    pub consumer: String,
    /// The events after the checkpoint, in position order (empty until the
    /// batch is opened).
    pub events: Vec<E>,
    /// The checkpoint the batch starts after.
    pub after: i64,
    /// The position of the batch's last event.
    pub last: i64,
    /// Why the events could not be read (a row that failed to scan): the
    /// batch then fails, counting toward `max_consecutive_failures`.
    pub problem: Option<String>,
    pub(crate) index: i64,
}

impl<E: Send + Sync + 'static> Record for ConsumerBatch<E> {
    fn id(&self) -> i64 {
        self.index
    }
}

/// A claimed batch and its transaction.
pub struct LogJob<E> {
    pub(crate) batch: ConsumerBatch<E>,
    pub(crate) lease: Lease,
    pub(crate) tx: Option<Transaction<'static, Postgres>>,
    /// Frees the consumer in this process however the job ends (also when the
    /// worker drops it without a mark, as for a lost assignment).
    pub(crate) _slot: Slot,
}

impl<E> fmt::Debug for LogJob<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogJob")
            .field("consumer", &self.batch.consumer)
            .field("after", &self.batch.after)
            .field("events", &self.batch.events.len())
            .finish_non_exhaustive()
    }
}

impl<E> LogJob<E> {
    /// The batch.
    pub fn batch(&self) -> &ConsumerBatch<E> {
        &self.batch
    }

    pub(crate) fn events_mut(&mut self) -> &mut Vec<E> {
        &mut self.batch.events
    }

    /// The batch's transaction: what the consumer writes here commits with the
    /// checkpoint advance, or not at all. `None` before the batch is opened.
    pub fn tx(&mut self) -> Option<&mut PgConnection> {
        self.tx.as_deref_mut()
    }
}

impl<E: Send + Sync + 'static> workerutil::Job for LogJob<E> {
    type Record = ConsumerBatch<E>;

    fn record(&self) -> &ConsumerBatch<E> {
        &self.batch
    }

    fn lease(&self) -> Lease {
        self.lease
    }
}
