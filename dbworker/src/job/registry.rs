//! `Handlers`: typed handlers, one per kind, as one worker's handler.

use std::future::Future;
use std::time::Duration;

use workerutil::{BoxError, Handler, HandlerError, JobContext, KindRegistry, Outcome, Retry};

use super::{ArgsHandler, ArgsRecord, JobArgs, JobHandler, TypedJob};
use crate::error::Result;
use crate::store::{DbConditions, DbJob, DbStore};

/// Typed handlers, one per kind, each under its arguments'
/// [`KIND`](JobArgs::KIND) and [`ALIASES`](JobArgs::ALIASES), with the
/// kind's [`JobDefaults`](super::JobDefaults) as its options. A job whose
/// kind has no handler fails, naming its kind and the registered ones.
///
/// [`Client`](crate::Client) keeps one; build one yourself for a worker you
/// assemble:
///
/// ```no_run
/// # use std::sync::Arc;
/// # use dbworker::prelude::*;
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Resize { width: u32 }
/// # impl JobArgs for Resize { const KIND: &'static str = "resize"; }
/// # struct Resizer;
/// # impl JobHandler for Resizer {
/// #     type Args = Resize;
/// #     async fn handle(&self, _: Job<'_, Resize>) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # fn f(store: Arc<DbStore<TypedJob>>) -> Result<(), dbworker::Error> {
/// let handlers = Handlers::new().with(Resizer)?;
/// assert!(handlers.kinds().contains(&"resize".to_owned()));
/// let worker = dbworker::new_worker(store, handlers, WorkerOptions::new("app"))?;
/// # let _ = worker; Ok(()) }
/// ```
pub struct Handlers<R: ArgsRecord = TypedJob> {
    registry: KindRegistry<DbStore<R>>,
}

impl<R: ArgsRecord> std::fmt::Debug for Handlers<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl<R: ArgsRecord> Default for Handlers<R> {
    fn default() -> Self {
        Handlers::new()
    }
}

impl<R: ArgsRecord> Handlers<R> {
    /// No handler yet.
    pub fn new() -> Handlers<R> {
        Handlers {
            registry: KindRegistry::new(|record: &R| record.kind()),
        }
    }

    /// Adds `handler` for its arguments' kind and aliases. Refuses a kind
    /// or alias that has a handler already, an empty kind and defaults
    /// that fail [`JobDefaults::validate`](super::JobDefaults::validate);
    /// the error names the kind, and the handlers are left as they were.
    pub fn add<H: JobHandler<R>>(&mut self, handler: H) -> Result<&mut Handlers<R>> {
        let kind = <H::Args as JobArgs>::KIND;
        let handler = ArgsHandler::new::<R>(handler)?;
        let options = handler.options().clone();
        // Every name is checked before any is added (the registry's builder
        // consumes it), so a refusal changes nothing.
        let mut names = self.kinds();
        for name in std::iter::once(&kind).chain(<H::Args as JobArgs>::ALIASES) {
            if name.is_empty() || names.iter().any(|k| k == name) {
                return Err(workerutil::Error::DuplicateKind((*name).to_owned()).into());
            }
            names.push((*name).to_owned());
        }
        let mut registry = self.take().register_with(kind, handler, options)?;
        for alias in <H::Args as JobArgs>::ALIASES {
            registry = registry.alias(*alias, kind)?;
        }
        self.registry = registry;
        Ok(self)
    }

    /// [`add`](Self::add), by value: `Handlers::new().with(A)?.with(B)?`.
    pub fn with<H: JobHandler<R>>(mut self, handler: H) -> Result<Handlers<R>> {
        self.add(handler)?;
        Ok(self)
    }

    /// The kinds and aliases that have a handler, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.registry().kinds()
    }

    /// Whether no handler was added.
    pub fn is_empty(&self) -> bool {
        self.kinds().is_empty()
    }

    /// Claims only jobs of the kinds that have a handler (`column` is the
    /// table's kind column as the claim names it), leaving the others for
    /// workers that handle them.
    pub(crate) fn restrict_dequeue(mut self, column: String) -> Handlers<R> {
        self.registry = self
            .take()
            .restrict_dequeue(move |kinds| DbConditions::new().column_in(&column, kinds));
        self
    }

    fn registry(&self) -> &KindRegistry<DbStore<R>> {
        &self.registry
    }

    fn take(&mut self) -> KindRegistry<DbStore<R>> {
        std::mem::replace(&mut self.registry, KindRegistry::new(|r: &R| r.kind()))
    }
}

impl<R: ArgsRecord> Handler<DbStore<R>> for Handlers<R> {
    fn pre_dequeue(
        &self,
    ) -> impl Future<Output = std::result::Result<Option<DbConditions>, BoxError>> + Send {
        self.registry().pre_dequeue()
    }

    fn pre_handle(&self, record: &R) -> impl Future<Output = ()> + Send {
        self.registry().pre_handle(record)
    }

    fn handle(
        &self,
        job: &mut DbJob<R>,
        ctx: &JobContext<DbStore<R>>,
    ) -> impl Future<Output = std::result::Result<(), HandlerError>> + Send {
        self.registry().handle(job, ctx)
    }

    fn post_handle(&self, record: &R, outcome: &Outcome) -> impl Future<Output = ()> + Send {
        self.registry().post_handle(record, outcome)
    }

    fn max_runtime(&self, record: &R) -> Option<Duration> {
        self.registry().max_runtime(record)
    }

    fn retry(&self, record: &R) -> Option<Retry> {
        self.registry().retry(record)
    }

    fn kind<'a>(&'a self, record: &'a R) -> Option<&'a str> {
        self.registry().kind(record)
    }
}
