//! Typed handlers: `JobHandler` receives a [`Job`] with the deserialized
//! arguments; `ArgsHandler` makes one a `workerutil::Handler`.

use std::fmt;
use std::future::Future;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext, KindOptions, Retry};

use super::{ArgsRecord, Job, JobArgs, TypedJob};
use crate::error::{Error, from_json};
use crate::store::{DbJob, DbStore};

/// Handles one kind of job, given its arguments: add it to a
/// [`Client`](crate::Client) (or a [`Handlers`](super::Handlers)).
/// Implement [`handle`](Self::handle) with `async fn`.
///
/// Arguments that do not deserialize never reach `handle`: the job fails,
/// non-retryable, with [`Error::Json`] naming the kind and the path of the
/// first mismatch (`cannot read the arguments of kind "send_email" (at
/// $.to): invalid type: integer `5`, expected a string`).
///
/// ```no_run
/// use dbworker::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
/// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
///
/// struct Mailer;
///
/// impl JobHandler for Mailer {
///     type Args = SendEmail;
///
///     async fn handle(&self, mut job: Job<'_, SendEmail>) -> Result<(), HandlerError> {
///         let to = job.args.to.clone();
///         sqlx::query("INSERT INTO sent (address) VALUES ($1)")
///             .bind(to)
///             .persistent(false)
///             .execute(job.tx()?)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait JobHandler<R: ArgsRecord = TypedJob>: Send + Sync + 'static {
    /// The kind's arguments.
    type Args: JobArgs;

    /// Processes one job, as [`Handler::handle`] does, given its arguments.
    fn handle(
        &self,
        job: Job<'_, Self::Args, R>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A [`JobHandler`] as a [`Handler`]: reads each job's arguments, then runs
/// it. [`Handlers`](super::Handlers)
/// wraps handlers in it; use it alone as a worker's handler when a table
/// holds one kind of job. It answers [`Handler::max_runtime`] and
/// [`Handler::retry`] with the kind's [`JobDefaults`](super::JobDefaults).
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
/// use dbworker::ArgsHandler;
///
/// // Every job of this table is a `Resize`.
/// let handler = ArgsHandler::new(Resizer)?;
/// let worker = dbworker::new_worker(store, handler, workerutil::WorkerOptions::new("resize"))?;
/// # let _ = worker; Ok(()) }
/// ```
pub struct ArgsHandler<H> {
    handler: H,
    options: KindOptions,
}

impl<H> fmt::Debug for ArgsHandler<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArgsHandler")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<H> ArgsHandler<H> {
    /// Wraps `handler`, with its kind's defaults. Refuses an empty kind
    /// and [`JobDefaults`](super::JobDefaults) that fail validation
    /// ([`Error::InvalidOption`], naming the kind).
    pub fn new<R: ArgsRecord>(handler: H) -> Result<ArgsHandler<H>, Error>
    where
        H: JobHandler<R>,
    {
        let kind = <H::Args as JobArgs>::KIND;
        let named = |err: Error| match err {
            Error::InvalidOption { field, reason } => Error::InvalidOption {
                field,
                reason: format!("kind {kind:?}: {reason}"),
            },
            other => other,
        };
        super::args::check_kind(kind).map_err(named)?;
        let options = <H::Args as JobArgs>::defaults()
            .kind_options()
            .map_err(named)?;
        Ok(ArgsHandler { handler, options })
    }

    /// The options its kind is registered with.
    pub(crate) fn options(&self) -> &KindOptions {
        &self.options
    }
}

/// Reads a record's arguments as `A`, naming the kind and the failing path.
pub(crate) fn read_args<A: JobArgs>(record: &impl ArgsRecord) -> Result<A, Error> {
    from_json(record.payload(), || {
        format!("cannot read the arguments of kind {:?}", record.kind())
    })
}
impl<R, H> Handler<DbStore<R>> for ArgsHandler<H>
where
    R: ArgsRecord,
    H: JobHandler<R>,
{
    async fn handle(
        &self,
        job: &mut DbJob<R>,
        ctx: &JobContext<DbStore<R>>,
    ) -> Result<(), HandlerError> {
        // Retrying cannot make a payload fit its type.
        let args = read_args::<H::Args>(job.record()).map_err(HandlerError::non_retryable)?;
        self.handler.handle(Job::new(args, job, ctx)).await
    }

    fn max_runtime(&self, _record: &R) -> Option<Duration> {
        self.options.max_runtime
    }

    fn retry(&self, _record: &R) -> Option<Retry> {
        self.options.retry.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Email {
        to: String,
        cc: Vec<String>,
    }

    impl JobArgs for Email {
        const KIND: &'static str = "email";
    }

    #[test]
    fn a_mismatch_names_the_kind_and_the_path() {
        let record = TypedJob::new(1, "email", serde_json::json!({"to": "a", "cc": ["b", 3]}));
        let err = read_args::<Email>(&record).unwrap_err().to_string();
        assert_eq!(
            err,
            "cannot read the arguments of kind \"email\" (at $.cc[1]): invalid type: integer `3`, expected a string"
        );
        let record = TypedJob::new(1, "email", serde_json::json!({"cc": []}));
        let err = read_args::<Email>(&record).unwrap_err().to_string();
        assert_eq!(
            err,
            "cannot read the arguments of kind \"email\" (at $): missing field `to`"
        );
    }
}
