//! What most applications import: `use dbworker::prelude::*;`.

pub use crate::enqueue::{Enqueuer, NewJob};
pub use crate::maintenance::Resetter;
pub use crate::store::{DbJob, DbStore, StoreOptions};
pub use crate::{Error, new_worker};
pub use workerutil::{
    Handler, HandlerError, JobContext, Outcome, Record, RecordId, Worker, WorkerOptions,
};
