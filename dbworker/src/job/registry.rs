//! Typed handlers in a `workerutil::KindRegistry`, one per kind.

use workerutil::KindRegistry;

use super::{ArgsHandler, ArgsRecord, JobArgs, JobHandler};
use crate::store::DbStore;

/// Typed handlers in a [`KindRegistry`]: each registered under its
/// arguments' [`KIND`](JobArgs::KIND), with the kind's
/// [`JobDefaults`](super::JobDefaults) as its options.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use dbworker::{DbJob, DbStore, job::{JobArgs, JobHandler, TypedJob}};
/// # use workerutil::{HandlerError, JobContext};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Resize { width: u32 }
/// # impl JobArgs for Resize { const KIND: &'static str = "resize"; }
/// # struct Resizer;
/// # impl JobHandler for Resizer {
/// #     type Args = Resize;
/// #     async fn handle(&self, _: Resize, _: &mut DbJob<TypedJob>, _: &JobContext<DbStore<TypedJob>>) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # fn f(store: Arc<DbStore<TypedJob>>) -> Result<(), dbworker::Error> {
/// use dbworker::job::ArgsRegistry;
/// use workerutil::KindRegistry;
///
/// let registry = KindRegistry::for_args().register_args(Resizer);
/// let worker = dbworker::new_worker(store, registry, workerutil::WorkerOptions::new("app"))?;
/// # let _ = worker; Ok(()) }
/// ```
pub trait ArgsRegistry<R: ArgsRecord>: Sized {
    /// An empty registry that reads each job's kind through
    /// [`ArgsRecord::kind`].
    fn for_args() -> Self;

    /// Registers `handler` for its arguments' kind, replacing any handler
    /// the kind had; the kind's `timeout`, `max_retries` and `retry`
    /// defaults become its [`KindOptions`](workerutil::KindOptions).
    ///
    /// # Panics
    ///
    /// If the kind is empty or its defaults fail
    /// [`JobDefaults::validate`](super::JobDefaults::validate): a
    /// configuration error, named with the kind.
    fn register_args<H: JobHandler<R>>(self, handler: H) -> Self;
}

impl<R: ArgsRecord> ArgsRegistry<R> for KindRegistry<DbStore<R>> {
    fn for_args() -> Self {
        KindRegistry::new(|record: &R| record.kind())
    }

    fn register_args<H: JobHandler<R>>(self, handler: H) -> Self {
        let handler = ArgsHandler::new::<R>(handler);
        let options = handler.options().clone();
        self.register_with(<H::Args as JobArgs>::KIND, handler, options)
    }
}
