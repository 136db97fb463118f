//! A consumer's slice of the log (`EventSlice`, what the handler gets) and the
//! claimed job that carries it with its transaction (`LogJob`).

use std::fmt;

use sqlx::{PgConnection, Postgres, Transaction};
use workerutil::{Lease, Record};

use super::books::Slot;

/// A place in a log's reading order: the event's writing transaction, then its
/// position. Consumers read events in this order, and only once every
/// transaction that could still add an event before them has ended, so a
/// checkpoint never passes an event that commits later (see
/// [checkpointed log consumers](crate::consumers#checkpointed-log-consumers)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub struct LogPoint {
    /// The transaction id (`xid8`) that wrote the event.
    pub xid: i64,
    /// The event's position.
    pub position: i64,
}

impl LogPoint {
    /// The point of the event at `position` written by transaction `xid`.
    pub fn new(xid: i64, position: i64) -> LogPoint {
        LogPoint { xid, position }
    }

    pub(crate) fn pair(self) -> (i64, i64) {
        (self.xid, self.position)
    }
}

/// One consumer's slice of the log: what the handler gets.
#[derive(Debug)]
#[non_exhaustive]
pub struct EventSlice<E> {
    /// The consumer's name.
    pub consumer: String,
    /// The events after the checkpoint, in reading order (by writing
    /// transaction, then position; empty until the slice is opened).
    pub events: Vec<E>,
    /// The checkpoint the slice starts after.
    pub after: i64,
    /// The position of the slice's last event.
    pub last: i64,
    /// Where the checkpoint moves when the slice commits.
    pub(crate) last_point: LogPoint,
    /// Why the events could not be read (a row that failed to scan): the
    /// slice then fails, counting toward `max_consecutive_failures`.
    pub problem: Option<String>,
    pub(crate) index: i64,
}

impl<E: Send + Sync + 'static> Record for EventSlice<E> {
    fn id(&self) -> i64 {
        self.index
    }
}

/// A claimed slice and its transaction.
pub struct LogJob<E> {
    pub(crate) slice: EventSlice<E>,
    pub(crate) lease: Lease,
    pub(crate) tx: Option<Transaction<'static, Postgres>>,
    /// Frees the consumer in this process however the job ends (also when the
    /// worker drops it without a mark, as for a lost assignment).
    pub(crate) _slot: Slot,
}

impl<E> fmt::Debug for LogJob<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogJob")
            .field("consumer", &self.slice.consumer)
            .field("after", &self.slice.after)
            .field("events", &self.slice.events.len())
            .finish_non_exhaustive()
    }
}

impl<E> LogJob<E> {
    /// The slice.
    pub fn slice(&self) -> &EventSlice<E> {
        &self.slice
    }

    pub(crate) fn events_mut(&mut self) -> &mut Vec<E> {
        &mut self.slice.events
    }

    /// The slice's transaction: what the consumer writes here commits with the
    /// checkpoint advance, or not at all. `None` before the slice is opened.
    pub fn tx(&mut self) -> Option<&mut PgConnection> {
        self.tx.as_deref_mut()
    }
}

impl<E: Send + Sync + 'static> workerutil::Job for LogJob<E> {
    type Record = EventSlice<E>;

    fn record(&self) -> &EventSlice<E> {
        &self.slice
    }

    fn lease(&self) -> Lease {
        self.lease
    }
}
