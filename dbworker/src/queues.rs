//! Named queues in one process: one worker per queue over a shared store, each
//! claiming only its queue's rows with its own handler count.
//!
#![doc = include_str!("../docs/modules/queues.md")]

use futures_util::future::join_all;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use workerutil::{
    BoxError, Handler, HandlerError, JobContext, Outcome, Record, ShutdownHandle, Worker,
    WorkerOptions, WorkerSummary,
};

use crate::columns::parse_dotted;
use crate::error::{Error, Result};
use crate::store::{DbConditions, DbStore};
use crate::worker::new_worker;

/// The queues a [`QueueWorkers`] serves and the options of their workers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QueueWorkersOptions {
    /// Every queue's worker starts from these (each gets its own name,
    /// `<name>:<queue>`, and handler count).
    pub worker: WorkerOptions,
    /// The queue column over the view's (or table's) alias, e.g. `"j.queue"`.
    /// `None` (the default): the store's table's
    /// [`queue_column`](crate::JobTableOptions::queue_column), which the
    /// `JobTable` knows.
    pub queue_column: Option<String>,
    /// `(queue, handlers)`: each queue served, with its handler count.
    pub queues: Vec<(String, usize)>,
}

impl QueueWorkersOptions {
    /// Workers with `worker` options over the table's queue column; add
    /// queues with [`queue`](Self::queue).
    pub fn new(worker: WorkerOptions) -> QueueWorkersOptions {
        QueueWorkersOptions {
            worker,
            queue_column: None,
            queues: Vec::new(),
        }
    }

    /// Serves `queue` with `handlers` handlers.
    pub fn queue(mut self, queue: impl Into<String>, handlers: usize) -> QueueWorkersOptions {
        self.queues.push((queue.into(), handlers));
        self
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Error::InvalidOption {
            field: "queues",
            reason,
        };
        if self.queues.is_empty() {
            return Err(invalid("name at least one queue".into()));
        }
        if let Some(column) = &self.queue_column
            && parse_dotted(column).is_none()
        {
            return Err(Error::InvalidOption {
                field: "queue_column",
                reason: format!("{column:?} is not `alias.column`"),
            });
        }
        for (i, (queue, _)) in self.queues.iter().enumerate() {
            if self.queues[..i].iter().any(|(q, _)| q == queue) {
                return Err(invalid(format!("queue {queue:?} is named twice")));
            }
            // Bound into every claim of its worker, it would fail them all.
            if queue.contains('\0') {
                return Err(invalid(format!(
                    "queue {queue:?} holds a NUL character (U+0000), which PostgreSQL cannot store"
                )));
            }
        }
        self.worker.validate()?;
        Ok(())
    }
}

/// Runs `handler` on each named queue with its own handler count, e.g.
/// `emails: 4, reports: 1`, in one process over one store.
///
/// Each queue gets its own [`Worker`] (named `<name>:<queue>`) whose claim adds
/// `<alias>.<queue_column> = ANY('{<queue>}')` to whatever the handler's
/// `pre_dequeue` returns, so a busy queue never takes the slots of another.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use dbworker::{DbJob, DbStore, queues::{QueueWorkers, QueueWorkersOptions}};
/// # use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};
/// # #[derive(sqlx::FromRow)] struct Job { id: i64 }
/// # impl Record for Job { fn id(&self) -> i64 { self.id } }
/// # struct Send;
/// # impl Handler<DbStore<Job>> for Send { async fn handle(&self, _: &mut DbJob<Job>, _: &JobContext<DbStore<Job>>) -> Result<(), HandlerError> { Ok(()) } }
/// # async fn f(store: Arc<DbStore<Job>>) -> Result<(), dbworker::Error> {
/// let options = QueueWorkersOptions::new(WorkerOptions::new("app"))
///     .queue("emails", 4)
///     .queue("reports", 1);
/// let workers = QueueWorkers::new(store, Send, options)?;
/// let shutdown = workers.shutdown_handle();
/// let summaries = workers.run().await; // until shutdown.graceful()
/// # let _ = (shutdown, summaries); Ok(()) }
/// ```
pub struct QueueWorkers<R: Record, H: Handler<DbStore<R>>> {
    workers: Vec<Worker<DbStore<R>, QueueHandler<H>>>,
}

impl<R: Record, H: Handler<DbStore<R>>> std::fmt::Debug for QueueWorkers<R, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWorkers")
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl<R: Record, H: Handler<DbStore<R>>> QueueWorkers<R, H> {
    /// One worker per queue of `options` over `store`, each with
    /// `options.worker` but its own name and handler count. The pool must
    /// serve every worker at once (checked here, as for one worker).
    pub fn new(store: Arc<DbStore<R>>, handler: H, options: QueueWorkersOptions) -> Result<Self> {
        options.validate()?;
        let QueueWorkersOptions {
            worker: options,
            queue_column,
            queues,
        } = options;
        let queues: Vec<(&str, usize)> = queues.iter().map(|(q, n)| (q.as_str(), *n)).collect();
        let queues = queues.as_slice();
        if queue_column.is_none()
            && let Some(view) = store.view_lacking_queue()
        {
            return Err(Error::InvalidOption {
                field: "queue_column",
                reason: format!(
                    "named queues claim by the queue column through the view {view}, which has no such column (add it to the view, or name an expression in QueueWorkersOptions::queue_column)"
                ),
            });
        }
        let Some(queue_column) = queue_column.or_else(|| store.queue_claim_column()) else {
            return Err(Error::InvalidOption {
                field: "queue_column",
                reason: "named queues need the table's queue column (JobTableOptions::queue_column; `dbworker migration --queue` adds it)".into(),
            });
        };
        let queue_column = queue_column.as_str();
        Self::check_pool(&store, &options, queues)?;
        let handler = Arc::new(handler);
        let mut workers = Vec::with_capacity(queues.len());
        for (queue, handlers) in queues {
            let mut o = options.clone();
            o.name = format!("{}:{queue}", options.name);
            o.num_handlers = *handlers;
            let queue_handler = QueueHandler {
                inner: handler.clone(),
                column: queue_column.to_owned(),
                queue: (*queue).to_owned(),
            };
            workers.push(new_worker(store.clone(), queue_handler, o)?);
        }
        Ok(QueueWorkers { workers })
    }

    /// Every queue's worker holds its connections at once, beside what the
    /// store shares between them.
    fn check_pool(
        store: &DbStore<R>,
        options: &WorkerOptions,
        queues: &[(&str, usize)],
    ) -> Result<()> {
        let mut needed = 0u32;
        let mut reason = String::new();
        for (_, handlers) in queues {
            let mut o = options.clone();
            o.num_handlers = *handlers;
            let need = store.pool_need(&o);
            needed = needed.saturating_add(need.per_worker);
            if reason.is_empty() {
                needed = needed.saturating_add(need.shared);
                reason = need.reason;
            }
        }
        store.check_pool(needed, format!("{} queues: {reason}", queues.len()))
    }

    /// Stops every queue's worker.
    pub fn shutdown_handle(&self) -> QueuesShutdown {
        QueuesShutdown(self.workers.iter().map(Worker::shutdown_handle).collect())
    }

    /// Subscribes to every queue's worker events, in queue order.
    pub fn subscribe(&self) -> Vec<tokio::sync::broadcast::Receiver<workerutil::WorkerEvent>> {
        self.workers.iter().map(Worker::subscribe).collect()
    }

    /// Runs every queue's worker until each stops; their summaries in queue order.
    pub async fn run(self) -> Vec<WorkerSummary> {
        join_all(self.workers.into_iter().map(Worker::run)).await
    }
}

/// Every queue's worker as one service: they run until `stop` fires, then
/// shut down gracefully (each within its drain timeout).
impl<R: Record, H: Handler<DbStore<R>>> crate::Service for QueueWorkers<R, H> {
    fn name(&self) -> &str {
        "queues"
    }

    async fn run(&self, stop: CancellationToken) -> Result<()> {
        for ran in join_all(self.workers.iter().map(|w| w.run_until(stop.clone()))).await {
            ran?;
        }
        Ok(())
    }
}

/// Stops the workers of a [`QueueWorkers`].
#[derive(Debug, Clone)]
pub struct QueuesShutdown(Vec<ShutdownHandle>);

impl QueuesShutdown {
    /// Stops claiming on every queue and lets running jobs finish (each worker
    /// within its drain timeout).
    pub fn graceful(&self) {
        self.0.iter().for_each(ShutdownHandle::graceful);
    }

    /// Stops every queue's jobs at once.
    pub fn immediate(&self) {
        self.0.iter().for_each(ShutdownHandle::immediate);
    }
}

/// The shared handler, claiming only its queue's rows.
struct QueueHandler<H> {
    inner: Arc<H>,
    column: String,
    queue: String,
}
impl<R: Record, H: Handler<DbStore<R>>> Handler<DbStore<R>> for QueueHandler<H> {
    async fn pre_dequeue(&self) -> std::result::Result<Option<DbConditions>, BoxError> {
        let conditions = self.inner.pre_dequeue().await?;
        Ok(conditions.map(|c| c.column_in(&self.column, std::slice::from_ref(&self.queue))))
    }

    async fn pre_handle(&self, record: &R) {
        self.inner.pre_handle(record).await;
    }

    async fn handle(
        &self,
        job: &mut crate::store::DbJob<R>,
        ctx: &JobContext<DbStore<R>>,
    ) -> std::result::Result<(), HandlerError> {
        self.inner.handle(job, ctx).await
    }

    async fn post_handle(&self, record: &R, outcome: &Outcome) {
        self.inner.post_handle(record, outcome).await;
    }
}
