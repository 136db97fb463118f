//! Typed enqueue: a [`JobArgs`] value as a `NewJob` (its kind, its
//! arguments as JSON, its kind's queue and priority), and [`IntoJob`], what
//! the `Enqueuer` methods take.

use super::NewJob;
use crate::error::{Result, to_json};
use crate::job::{JobArgs, check_kind};

impl NewJob {
    /// A job of kind `A::KIND` whose payload column holds `args` as JSON,
    /// with the kind's default queue and priority
    /// ([`JobArgs::defaults`]). Every builder method still applies, and
    /// overrides a default: `NewJob::args(&a)?.queue("urgent").run_after(d)`.
    /// The enqueuer's table needs `kind_column` and `payload_column`
    /// ([`JobTableOptions::typed`](crate::JobTableOptions::typed)).
    ///
    /// Fails with [`Error::Json`](crate::Error::Json) if `args` does not
    /// serialize (a map with non-string keys, say), and with
    /// [`Error::InvalidOption`](crate::Error::InvalidOption) if the kind is
    /// empty or its defaults are invalid.
    ///
    /// ```
    /// use dbworker::{NewJob, JobArgs};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Resize { image: String, width: u32 }
    /// impl JobArgs for Resize { const KIND: &'static str = "resize"; }
    ///
    /// let job = NewJob::args(&Resize { image: "cat.png".into(), width: 200 })?.priority(5);
    /// # let _ = job;
    /// # Ok::<(), dbworker::Error>(())
    /// ```
    pub fn args<A: JobArgs>(args: &A) -> Result<NewJob> {
        check_kind(A::KIND)?;
        let defaults = A::defaults();
        defaults.validate()?;
        let payload = to_json(args, || {
            format!("cannot write the arguments of kind {:?}", A::KIND)
        })?;
        let mut job = NewJob::new().kind(A::KIND).with_payload(payload);
        if let Some(queue) = defaults.queue {
            job = job.queue(queue);
        }
        if let Some(priority) = defaults.priority {
            job = job.priority(priority);
        }
        if let Some(key) = args.fair_key() {
            job = job.fair_key(key);
        }
        Ok(job)
    }
}

/// What the enqueue methods take: a [`JobArgs`] value (enqueued as
/// [`NewJob::args`] makes it) or a [`NewJob`] (by value or by reference).
///
/// ```no_run
/// # use dbworker::prelude::*;
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Resize { width: u32 }
/// # impl JobArgs for Resize { const KIND: &'static str = "resize"; }
/// # async fn f(enqueuer: Enqueuer) -> Result<(), dbworker::Error> {
/// enqueuer.enqueue(Resize { width: 200 }).await?; // the kind's defaults
/// enqueuer.enqueue(NewJob::args(&Resize { width: 400 })?.priority(1)).await?;
/// let ids = enqueuer.enqueue_many([100, 800].map(|width| Resize { width })).await?;
/// # let _ = ids; Ok(()) }
/// ```
pub trait IntoJob {
    /// The job to insert; an error if the arguments do not serialize or
    /// their kind's defaults are invalid.
    fn into_job(self) -> Result<NewJob>;
}

impl IntoJob for NewJob {
    fn into_job(self) -> Result<NewJob> {
        Ok(self)
    }
}

impl IntoJob for &NewJob {
    fn into_job(self) -> Result<NewJob> {
        Ok(self.clone())
    }
}

impl<A: JobArgs> IntoJob for A {
    fn into_job(self) -> Result<NewJob> {
        NewJob::args(&self)
    }
}
