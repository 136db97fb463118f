//! Many kinds of job in one table: a handler per kind, one worker dispatching.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::error::{BoxError, Error};
use crate::handler::{Handler, JobContext};
use crate::metrics;
use crate::outcome::{HandlerError, Outcome};
use crate::retry::Retry;
use crate::store::{Job, Store};

/// A future a registered handler returns, boxed so handlers of different
/// types share one map.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`Handler`] behind a pointer: the registry's map holds handlers of
/// many types, and `Handler`'s `impl Future` returns cannot be called
/// through `dyn`.
trait AnyHandler<S: Store>: Send + Sync + 'static {
    fn pre_handle<'a>(&'a self, record: &'a S::Record) -> BoxFuture<'a, ()>;
    fn handle<'a>(
        &'a self,
        job: &'a mut S::Job,
        ctx: &'a JobContext<S>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    fn post_handle<'a>(&'a self, record: &'a S::Record, outcome: &'a Outcome) -> BoxFuture<'a, ()>;
    fn max_runtime(&self, record: &S::Record) -> Option<Duration>;
    fn retry(&self, record: &S::Record) -> Option<Retry>;
}

impl<S: Store, H: Handler<S>> AnyHandler<S> for H {
    fn pre_handle<'a>(&'a self, record: &'a S::Record) -> BoxFuture<'a, ()> {
        Box::pin(Handler::pre_handle(self, record))
    }

    fn handle<'a>(
        &'a self,
        job: &'a mut S::Job,
        ctx: &'a JobContext<S>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(Handler::handle(self, job, ctx))
    }

    fn post_handle<'a>(&'a self, record: &'a S::Record, outcome: &'a Outcome) -> BoxFuture<'a, ()> {
        Box::pin(Handler::post_handle(self, record, outcome))
    }

    fn max_runtime(&self, record: &S::Record) -> Option<Duration> {
        Handler::max_runtime(self, record)
    }

    fn retry(&self, record: &S::Record) -> Option<Retry> {
        Handler::retry(self, record)
    }
}

/// Reads a record's kind.
type KindOf<R> = Box<dyn for<'a> Fn(&'a R) -> &'a str + Send + Sync>;
/// Builds the dequeue conditions that admit only the registered kinds.
type Restrict<C> = Box<dyn Fn(&[String]) -> C + Send + Sync>;

/// A [`Handler`] that runs each job with the handler registered for its kind.
///
/// A job whose kind has no handler fails (non-retryable) with a message naming
/// the kind and the registered ones. With [`restrict_dequeue`](Self::restrict_dequeue)
/// the worker claims only registered kinds, leaving the others for workers
/// that handle them. Each job runs in a `kind` span, and
/// [`JOBS_BY_KIND_TOTAL`](crate::metrics::JOBS_BY_KIND_TOTAL) counts outcomes
/// per kind, [`JOB_DURATION_BY_KIND_SECONDS`](crate::metrics::JOB_DURATION_BY_KIND_SECONDS)
/// times each kind's handler and [`IN_FLIGHT_BY_KIND`](crate::metrics::IN_FLIGHT_BY_KIND)
/// counts the jobs of each kind in their handler (seed 002's
/// `job_duration_seconds{kind}` and `in_flight{kind}`).
///
/// ```
/// use workerutil::{Handler, HandlerError, JobContext, KindRegistry, MemoryJob, MemoryStore, Record};
///
/// #[derive(Clone, Debug)]
/// struct Task { id: i64, kind: String }
/// impl Record for Task { fn id(&self) -> i64 { self.id } }
///
/// struct SendEmail;
/// impl Handler<MemoryStore<Task>> for SendEmail {
///     async fn handle(&self, _job: &mut MemoryJob<Task>, _ctx: &JobContext<MemoryStore<Task>>) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
///
/// let registry = KindRegistry::<MemoryStore<Task>>::new(|t: &Task| t.kind.as_str())
///     .register("send_email", SendEmail)?
///     .alias("email", "send_email")?; // its name before a rename
/// assert_eq!(registry.kinds(), ["email", "send_email"]);
/// assert!(registry.register("email", SendEmail).is_err()); // one handler per kind
/// # Ok::<(), workerutil::Error>(())
/// ```
pub struct KindRegistry<S: Store> {
    kind_of: KindOf<S::Record>,
    handlers: BTreeMap<String, Arc<dyn AnyHandler<S>>>,
    options: BTreeMap<String, KindOptions>,
    restrict: Option<Restrict<S::Conditions>>,
}

/// What a kind may set for itself in a [`KindRegistry`], overriding the
/// worker's and the store's options for its jobs.
///
/// ```
/// # use std::time::Duration;
/// use workerutil::{KindOptions, Retry, RetryPolicy};
///
/// let options = KindOptions::max_runtime(Duration::from_secs(600))
///     .with_retry(Retry::new().max_retries(1).delay(RetryPolicy::fixed(Duration::from_secs(30))));
/// assert_eq!(options.retry.unwrap().max_retries, Some(1));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct KindOptions {
    /// How long one of its jobs may run before it times out (as
    /// `WorkerOptions::max_runtime_per_job`). `None`: the worker's;
    /// `Duration::MAX`: no limit ([`KindOptions::no_timeout`]).
    pub max_runtime: Option<Duration>,
    /// How its errored jobs are retried (the delay and how many times),
    /// overriding the store's policy; a job's own retry limit (a `max_retries`
    /// column) still wins. `None`: the handler's [`Handler::retry`], else the
    /// store's.
    pub retry: Option<Retry>,
}

impl KindOptions {
    /// Jobs of the kind time out after `max_runtime`.
    pub fn max_runtime(max_runtime: Duration) -> KindOptions {
        KindOptions::default().with_max_runtime(max_runtime)
    }

    /// Jobs of the kind run without a time limit, whatever the worker's
    /// `max_runtime_per_job` (River's `Timeout() == -1`): for a kind whose
    /// jobs legitimately run for hours. Cancellation, a lost lease and a
    /// shutdown still stop them.
    pub fn no_timeout() -> KindOptions {
        KindOptions::default().with_max_runtime(Duration::MAX)
    }

    /// Jobs of the kind are retried as `retry` says.
    pub fn retry(retry: Retry) -> KindOptions {
        KindOptions::default().with_retry(retry)
    }

    /// Sets the maximum runtime: positive (a zero one, which would time
    /// every job of the kind out at once, is refused where the kind is
    /// registered, as `WorkerOptions::max_runtime_per_job` refuses it).
    pub fn with_max_runtime(mut self, max_runtime: Duration) -> KindOptions {
        self.max_runtime = Some(max_runtime);
        self
    }

    /// The first bad field, named, and why: `max_runtime` zero, or a retry
    /// delay that fails [`RetryPolicy::check`](crate::RetryPolicy::check).
    /// [`KindRegistry::register_with`] checks them.
    fn check(&self) -> Result<(), String> {
        if self.max_runtime.is_some_and(|max| max.is_zero()) {
            return Err("max_runtime must be positive".to_owned());
        }
        match self
            .retry
            .as_ref()
            .and_then(|r| r.delay.as_ref())
            .map(|d| d.check())
        {
            Some(Err((field, reason))) => Err(format!("retry.delay.{field} {reason}")),
            _ => Ok(()),
        }
    }

    /// Sets the retry policy (its delay is checked where the kind is
    /// registered, see [`RetryPolicy::check`](crate::RetryPolicy::check)).
    pub fn with_retry(mut self, retry: Retry) -> KindOptions {
        self.retry = Some(retry);
        self
    }
}

impl<S: Store> std::fmt::Debug for KindRegistry<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindRegistry")
            .field("kinds", &self.kinds())
            .field("restricts_dequeue", &self.restrict.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store> KindRegistry<S> {
    /// An empty registry; `kind_of` reads a record's kind (its `kind` column).
    pub fn new(kind_of: impl for<'a> Fn(&'a S::Record) -> &'a str + Send + Sync + 'static) -> Self {
        KindRegistry {
            kind_of: Box::new(kind_of),
            handlers: BTreeMap::new(),
            options: BTreeMap::new(),
            restrict: None,
        }
    }

    /// Registers `handler` for `kind`. A kind registered already (as a kind
    /// or an alias) is refused ([`Error::DuplicateKind`]), as is an empty one.
    pub fn register(
        self,
        kind: impl Into<String>,
        handler: impl Handler<S>,
    ) -> Result<Self, Error> {
        self.register_with(kind, handler, KindOptions::default())
    }

    /// Registers `handler` for `kind` with options of its own (a maximum
    /// runtime overriding the worker's, a retry policy overriding the
    /// store's). Refuses a kind registered already ([`Error::DuplicateKind`]),
    /// an empty kind, a zero `max_runtime` and a retry delay that fails
    /// [`RetryPolicy::check`](crate::RetryPolicy::check)
    /// ([`Error::InvalidOption`], naming the kind).
    pub fn register_with(
        mut self,
        kind: impl Into<String>,
        handler: impl Handler<S>,
        options: KindOptions,
    ) -> Result<Self, Error> {
        let kind = kind.into();
        self.check_new(&kind)?;
        if let Err(reason) = options.check() {
            return Err(Error::InvalidOption {
                field: "KindOptions",
                reason: format!("kind {kind:?}: {reason}"),
            });
        }
        self.handlers.insert(kind.clone(), Arc::new(handler));
        self.options.insert(kind, options);
        Ok(self)
    }

    /// Runs jobs of kind `alias` with `kind`'s handler and options: the old
    /// name of a renamed kind, so jobs enqueued under it still run. `kind`
    /// must be registered; `alias` must not be.
    pub fn alias(mut self, alias: impl Into<String>, kind: &str) -> Result<Self, Error> {
        let alias = alias.into();
        self.check_new(&alias)?;
        let (Some(handler), Some(options)) = (self.handlers.get(kind), self.options.get(kind))
        else {
            return Err(Error::InvalidOption {
                field: "alias",
                reason: format!("alias {alias:?} names kind {kind:?}, which is not registered"),
            });
        };
        let (handler, options) = (handler.clone(), options.clone());
        self.handlers.insert(alias.clone(), handler);
        self.options.insert(alias, options);
        Ok(self)
    }

    /// Refuses an empty kind and one registered already.
    fn check_new(&self, kind: &str) -> Result<(), Error> {
        if kind.is_empty() {
            return Err(Error::InvalidOption {
                field: "kind",
                reason: "a kind must not be empty".into(),
            });
        }
        if self.handlers.contains_key(kind) {
            return Err(Error::DuplicateKind(kind.to_owned()));
        }
        Ok(())
    }

    /// Claims only jobs of registered kinds: `conditions` turns the registered
    /// kinds into the store's dequeue conditions (for the Postgres store,
    /// `DbConditions::column_in("j.kind", kinds)`).
    pub fn restrict_dequeue(
        mut self,
        conditions: impl Fn(&[String]) -> S::Conditions + Send + Sync + 'static,
    ) -> Self {
        self.restrict = Some(Box::new(conditions));
        self
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    fn handler_for<'a>(
        &'a self,
        record: &'a S::Record,
    ) -> (&'a str, Option<&'a Arc<dyn AnyHandler<S>>>) {
        let kind = (self.kind_of)(record);
        (kind, self.handlers.get(kind))
    }
}

impl<S: Store> Handler<S> for KindRegistry<S> {
    async fn pre_dequeue(&self) -> Result<Option<S::Conditions>, BoxError> {
        Ok(Some(match &self.restrict {
            Some(restrict) => restrict(&self.kinds()),
            None => S::Conditions::default(),
        }))
    }

    async fn pre_handle(&self, record: &S::Record) {
        if let (_, Some(handler)) = self.handler_for(record) {
            handler.pre_handle(record).await;
        }
    }

    async fn handle(&self, job: &mut S::Job, ctx: &JobContext<S>) -> Result<(), HandlerError> {
        let (kind, handler) = self.handler_for(job.record());
        let Some(handler) = handler.cloned() else {
            return Err(HandlerError::non_retryable(format!(
                "no handler is registered for kind {kind:?} (registered: {})",
                self.kinds().join(", ")
            )));
        };
        let span = tracing::info_span!("kind", kind = %kind);
        let _in_flight = metrics::KindInFlight::enter(kind);
        handler.handle(job, ctx).instrument(span).await
    }

    fn max_runtime(&self, record: &S::Record) -> Option<Duration> {
        let kind = (self.kind_of)(record);
        let own = self.options.get(kind).and_then(|o| o.max_runtime);
        own.or_else(|| self.handlers.get(kind)?.max_runtime(record))
    }

    fn retry(&self, record: &S::Record) -> Option<Retry> {
        let kind = (self.kind_of)(record);
        let own = self.options.get(kind).and_then(|o| o.retry.clone());
        own.or_else(|| self.handlers.get(kind)?.retry(record))
    }

    fn kind<'a>(&'a self, record: &'a S::Record) -> Option<&'a str> {
        Some((self.kind_of)(record))
    }

    async fn post_handle(&self, record: &S::Record, outcome: &Outcome) {
        let (_, handler) = self.handler_for(record);
        if let Some(handler) = handler {
            handler.post_handle(record, outcome).await;
        }
    }
}
