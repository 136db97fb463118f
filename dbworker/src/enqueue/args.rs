//! Typed enqueue: a [`JobArgs`] value as a `NewJob` (its kind, its
//! arguments as JSON, its kind's queue and priority), and the `Enqueuer`
//! shortcuts for one.

use sqlx::PgConnection;

use super::{Enqueued, Enqueuer, NewJob};
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
    /// use dbworker::{NewJob, job::JobArgs};
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
        Ok(job)
    }
}

impl Enqueuer {
    /// Enqueues `args` on the enqueuer's pool: [`NewJob::args`], then
    /// [`enqueue`](Self::enqueue). For other options build the `NewJob`;
    /// for many, [`enqueue_many`](Self::enqueue_many) the `NewJob`s.
    ///
    /// ```no_run
    /// # use dbworker::{Enqueuer, JobTable, JobTableOptions, NewJob, job::JobArgs};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Resize { width: u32 }
    /// # impl JobArgs for Resize { const KIND: &'static str = "resize"; }
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
    /// let jobs = JobTable::new(&pool, JobTableOptions::typed("jobs")).await?;
    /// let enqueuer = Enqueuer::new(&pool, &jobs).await?;
    /// let id = enqueuer.enqueue_args(&Resize { width: 200 }).await?.id();
    /// // Many, all or none:
    /// let jobs = [100, 200, 400].map(|width| NewJob::args(&Resize { width }));
    /// let ids = enqueuer.enqueue_many(&jobs.into_iter().collect::<Result<Vec<_>, _>>()?).await?;
    /// # let _ = (id, ids); Ok(()) }
    /// ```
    pub fn enqueue_args<A: JobArgs>(
        &self,
        args: &A,
    ) -> impl Future<Output = Result<Enqueued>> + Send + use<'_, A> {
        // Serialized before the future, which so holds no `&A` (and needs no
        // `A: Sync` to be sent).
        let job = NewJob::args(args);
        async move { self.enqueue(&job?).await }
    }

    /// Enqueues `args` on the caller's connection or inside its transaction:
    /// the job commits with the caller's writes.
    pub fn enqueue_args_in<'a, A: JobArgs>(
        &'a self,
        conn: &'a mut PgConnection,
        args: &A,
    ) -> impl Future<Output = Result<Enqueued>> + Send + use<'a, A> {
        let job = NewJob::args(args);
        async move { self.enqueue_in(conn, &job?).await }
    }
}
