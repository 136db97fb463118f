//! What most applications import: `use dbworker::prelude::*;`.

pub use crate::enqueue::{Enqueuer, IntoJob, NewJob};
pub use crate::job::{Handlers, Job, JobArgs, JobDefaults, JobHandler, TypedJob};
pub use crate::maintenance::resetter::{Resetter, ResetterOptions};
pub use crate::store::{DbJob, DbStore, StoreOptions};
pub use crate::table::{JobTable, JobTableOptions};
pub use crate::{Client, ClientOptions, Error, Service, new_worker};
pub use workerutil::{
    Handler, HandlerError, JobContext, KindRegistry, Outcome, Record, RecordId, Worker,
    WorkerOptions,
};
