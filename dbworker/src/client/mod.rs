//! `Client`: one value that enqueues typed jobs and runs everything a job
//! table needs in this process: the worker with its typed handlers, the
//! resetter that brings back the jobs of dead workers and, when asked, the
//! purger, the gauges and the application's services; in a cluster, the
//! singletons only while it leads. Started with one call, stopped with one
//! `shutdown()`. The pieces stay public for applications that assemble
//! their own.

mod leading;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use workerutil::{ShutdownHandle, Worker, WorkerEvent, WorkerOptions, WorkerSummary};

use crate::enqueue::{Enqueued, Enqueuer, IntoJob};
use crate::error::{Error, Result};
use crate::job::{Handlers, JobHandler, TypedJob};
use crate::maintenance::resetter::{Resetter, ResetterOptions};
use crate::maintenance::{PurgeOptions, Purger};
use crate::service::Service;
use crate::store::{DbStore, QueueGauges, StoreOptions};
use crate::table::JobTable;

pub use leading::ClusterOptions;
use leading::{LeaderStarter, Membership, Run, leader_starter};

/// How a [`Client`] runs. Deserializable from a config file; every field
/// left out keeps its default.
///
/// ```
/// let options: dbworker::ClientOptions = serde_json::from_str(r#"{
///     "worker": { "name": "emails", "num_handlers": 8 },
///     "purge": { "interval": "1m" },
///     "gauges": "15s"
/// }"#).unwrap();
/// assert_eq!(options.worker.num_handlers, 8);
/// assert_eq!(options.gauges, Some(std::time::Duration::from_secs(15)));
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The worker: its name (also the store's, in logs and the registry),
    /// its handler count, timing and drain bound. Default
    /// `WorkerOptions::new("dbworker")`.
    pub worker: WorkerOptions,
    /// The resetter, which requeues the jobs of dead workers; runs in every
    /// client (passes are idempotent). `None` (the default): the resetter's
    /// defaults, with the store's stalled age.
    pub resetter: Option<ResetterOptions>,
    /// The purger, which deletes finished jobs after their retention. `None`
    /// (the default): no purger in this client.
    pub purge: Option<PurgeOptions>,
    /// How often the queue gauges ([`QueueGauges`]) are sampled. `None`
    /// (the default, `"off"` in a file): no gauges from this client.
    #[serde(with = "workerutil::duration::option")]
    pub gauges: Option<Duration>,
    /// Joins a cluster: the client registers its process in the worker
    /// registry and campaigns for its table's lease, and the singletons (the
    /// resetter, the purger, the gauges and the services added with
    /// [`ClientBuilder::leader_service`]) run only on the leader, their
    /// writes fenced by its term; the resetter then also requeues the jobs
    /// of a dead process at once. `None` (the default): every client runs
    /// its own singletons (their passes are idempotent).
    pub cluster: Option<ClusterOptions>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            worker: WorkerOptions::new("dbworker"),
            resetter: None,
            purge: None,
            gauges: None,
            cluster: None,
        }
    }
}

/// Builds a [`Client`]: the handlers, the options, then
/// [`build`](Self::build). A refused handler (a kind added twice, invalid
/// defaults) is reported by `build`.
#[must_use = "a builder does nothing until build() is awaited"]
pub struct ClientBuilder {
    pool: PgPool,
    table: JobTable,
    handlers: Result<Handlers>,
    store: Option<StoreOptions>,
    options: ClientOptions,
    services: Vec<Starter>,
    singletons: Vec<LeaderStarter>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("table", &self.table.name())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Adds the handler of one kind of job (its arguments' `KIND` and
    /// aliases).
    pub fn handler<H: JobHandler>(mut self, handler: H) -> ClientBuilder {
        self.handlers = self.handlers.and_then(|h| h.with(handler));
        self
    }

    /// Runs `service` (a cron [`Scheduler`](crate::cron::Scheduler), the
    /// [`History`](crate::history::History), one of yours) with the client:
    /// started by [`Client::start`], stopped by [`Client::shutdown`].
    pub fn service(mut self, service: impl Service) -> ClientBuilder {
        self.services.push(starter(service));
        self
    }

    /// Runs `service` as a singleton: in a cluster
    /// ([`ClientOptions::cluster`]) only while this client leads, given the
    /// term ([`Service::run_as_leader`]); outside one, as
    /// [`service`](Self::service) does.
    pub fn leader_service(mut self, service: impl Service) -> ClientBuilder {
        self.singletons.push(leader_starter(service));
        self
    }

    /// Sets the options (default [`ClientOptions::default`]).
    pub fn options(mut self, options: ClientOptions) -> ClientBuilder {
        self.options = options;
        self
    }

    /// Sets the store's options (retries, handling, claim); default
    /// `StoreOptions::new` named as the worker.
    pub fn store_options(mut self, options: StoreOptions) -> ClientBuilder {
        self.store = Some(options);
        self
    }

    /// Checks everything and builds the client, not yet running: the
    /// handlers, the options, the grants of every part (the enqueuer's, the
    /// store's, the resetter's, the purger's), the pool's size against the
    /// worker's handlers. Jobs can be enqueued at once; [`Client::start`]
    /// or [`Client::run_until_empty`] runs them.
    pub async fn build(self) -> Result<Client> {
        let handlers = self.handlers?;
        if handlers.is_empty() {
            return Err(Error::InvalidOption {
                field: "handler",
                reason: "a client needs at least one handler (ClientBuilder::handler)".into(),
            });
        }
        let mut o = self.options;
        o.worker.validate()?;
        let store = match self.store {
            Some(store) => store,
            None => StoreOptions::new(o.worker.name.clone()),
        };
        // Typed jobs are read as `id`, `kind`, `payload`, unless the table
        // says how it is read.
        let typed = typed_select(&self.table)?;
        view_has_typed_columns(&self.table)?;
        let read = match self.table.column_expressions() {
            [] => self.table.reading(typed),
            _ => self.table.clone(),
        };
        let enqueuer = Enqueuer::new(&self.pool, &self.table).await?;
        let store = DbStore::new(&self.pool, &read, store).await?;
        let mut ro = o
            .resetter
            .clone()
            .unwrap_or_else(|| ResetterOptions::for_store(&store));
        if let Some(cluster) = &o.cluster
            && ro.node_table.is_none()
        {
            ro.node_table = Some(cluster.node.node_table.clone());
            ro.dead_after = orphaned_after(
                cluster.node.dead_after,
                o.worker.heartbeat_failure_limit,
                o.worker.heartbeat_interval,
            );
        }
        let mut singletons = vec![leader_starter(
            Resetter::new(&self.pool, &self.table, ro).await?,
        )];
        if let Some(po) = &o.purge {
            singletons.push(leader_starter(
                Purger::new(&self.pool, &self.table, po.clone()).await?,
            ));
        }
        let store = Arc::new(store);
        if let Some(interval) = o.gauges {
            singletons.push(leader_starter(QueueGauges::new(store.clone(), interval)?));
        }
        singletons.extend(self.singletons);
        // Registers as late as it can: only the worker, named by the node's
        // id, comes after, and a refused worker deregisters it.
        let membership = match &o.cluster {
            Some(cluster) => {
                let mut cluster = cluster.clone();
                cluster.node.handlers = u32::try_from(o.worker.num_handlers).unwrap_or(u32::MAX);
                cluster.node.honours = self.table.honours();
                Some(Membership::join(&self.pool, &cluster, self.table.name()).await?)
            }
            None => None,
        };
        if let Some(m) = &membership
            && o.worker.hostname.is_none()
        {
            // The resetter knows a dead process's jobs by this name.
            o.worker.hostname = Some(m.node.id().to_owned());
        }

        // Claims only the kinds this client handles.
        let kind_column = (self.table.kind_column()).map(|c| self.table.sql().read_column(c));
        let handlers = match kind_column {
            Some(column) => handlers.restrict_dequeue(column),
            None => handlers,
        };
        let worker = match crate::new_worker(store.clone(), handlers, o.worker) {
            Ok(worker) => worker,
            Err(err) => {
                if let Some(m) = &membership {
                    let _ = m.node.deregister().await;
                }
                return Err(err);
            }
        };
        let events = worker.subscribe();
        Ok(Client {
            enqueuer,
            store,
            shutdown: worker.shutdown_handle(),
            events,
            stop: CancellationToken::new(),
            parts: Mutex::new(Parts::Built(Box::new(Built {
                worker: Box::new(worker),
                services: self.services,
                singletons,
                membership,
            }))),
        })
    }
}

/// The select a `TypedJob` is read with: `alias.*` when the table's columns
/// carry its names, else each one renamed.
fn typed_select(table: &JobTable) -> Result<Vec<String>> {
    let (Some(kind), Some(payload)) = (table.kind_column(), table.payload_column()) else {
        return Err(Error::InvalidOption {
            field: "kind_column",
            reason: "a client runs typed jobs: the table needs a kind and a payload column (JobTableOptions::typed; `dbworker migration --typed` adds them)".into(),
        });
    };
    let id = table.id_column();
    if kind == "kind" && payload == "payload" && id == "id" {
        return Ok(Vec::new());
    }
    let read = |column| table.sql().read_column(column);
    Ok(vec![
        format!("{} AS id", read(id)),
        format!("{} AS kind", read(kind)),
        format!("{} AS payload", read(payload)),
    ])
}

/// Through a view, a client names the kind column there (it claims only
/// its kinds) and, reading typed jobs, the payload: a view leaving one out
/// would fail every claim, or every job's read.
fn view_has_typed_columns(table: &JobTable) -> Result<()> {
    let t = table.sql();
    let Some(view) = &t.view else {
        return Ok(());
    };
    let read_typed = t.column_expressions.is_empty();
    let missing: Vec<&str> = [
        table.kind_column(),
        table.payload_column().filter(|_| read_typed),
    ]
    .into_iter()
    .flatten()
    .filter(|c| t.view_lacks.iter().any(|l| l == c))
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidOption {
        field: "view_name",
        reason: format!(
            "a client reads typed jobs through the view {}, which has no column {}",
            view.display_name(),
            missing.join(", no column ")
        ),
    })
}

type Worker_ = Worker<DbStore<TypedJob>, Handlers>;
/// Spawns a service on the runtime, to run until the token fires.
type Starter = Box<dyn FnOnce(CancellationToken) -> JoinHandle<()> + Send>;
/// A client's parts before it starts: the worker, its services, its
/// singletons and, in a cluster, its registry row and election.
struct Built {
    worker: Box<Worker_>,
    services: Vec<Starter>,
    singletons: Vec<LeaderStarter>,
    membership: Option<Membership>,
}

enum Parts {
    Built(Box<Built>),
    Running {
        worker: JoinHandle<WorkerSummary>,
        services: Vec<JoinHandle<()>>,
    },
    Stopped,
}

/// Enqueues typed jobs into one job table and runs them in this process.
///
/// A started client runs on the Tokio runtime's tasks until
/// [`shutdown`](Client::shutdown): dropping it does not stop them, so call
/// `shutdown` when the application stops (a SIGTERM handler, say).
///
/// ```no_run
/// use dbworker::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Square { n: i64 }
/// impl JobArgs for Square { const KIND: &'static str = "square"; }
///
/// struct Squarer;
/// impl JobHandler for Squarer {
///     type Args = Square;
///     async fn handle(&self, job: Job<'_, Square>) -> Result<(), HandlerError> {
///         println!("{}", job.args.n * job.args.n);
///         Ok(())
///     }
/// }
///
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let jobs = JobTable::new(&pool, JobTableOptions::typed("jobs")).await?;
/// let client = Client::builder(&pool, &jobs).handler(Squarer).build().await?;
/// client.start()?;
/// client.enqueue(Square { n: 7 }).await?;
/// // ... until the application stops:
/// client.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Client {
    enqueuer: Enqueuer,
    store: Arc<DbStore<TypedJob>>,
    shutdown: ShutdownHandle,
    events: broadcast::Receiver<WorkerEvent>,
    stop: CancellationToken,
    parts: Mutex<Parts>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.store.name())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A builder over `table`, on `pool` (sized for the worker's handlers
    /// plus a few: the store checks it).
    pub fn builder(pool: &PgPool, table: &JobTable) -> ClientBuilder {
        ClientBuilder {
            pool: pool.clone(),
            table: table.clone(),
            handlers: Ok(Handlers::new()),
            store: None,
            options: ClientOptions::default(),
            services: Vec::new(),
            singletons: Vec::new(),
        }
    }

    /// Enqueues one job (arguments, or a [`NewJob`](crate::NewJob)) on the
    /// pool.
    pub async fn enqueue(&self, job: impl IntoJob) -> Result<Enqueued> {
        self.enqueuer.enqueue(job).await
    }

    /// Enqueues one job inside the caller's transaction: it commits with the
    /// caller's writes.
    pub async fn enqueue_in(&self, conn: &mut PgConnection, job: impl IntoJob) -> Result<Enqueued> {
        self.enqueuer.enqueue_in(conn, job).await
    }

    /// Enqueues many jobs, all or none; returns their ids in order.
    pub async fn enqueue_many<J: IntoJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<i64>> {
        self.enqueuer.enqueue_many(jobs).await
    }

    /// The enqueuer (bulk `COPY`, workflows' enqueue).
    pub fn enqueuer(&self) -> &Enqueuer {
        &self.enqueuer
    }

    /// The store the worker claims from.
    pub fn store(&self) -> &Arc<DbStore<TypedJob>> {
        &self.store
    }

    /// The worker's events (a job started, finished, ...), from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<WorkerEvent> {
        self.events.resubscribe()
    }

    /// Starts the worker and the services on the current Tokio runtime and
    /// returns at once. Refused if the client was started already.
    pub fn start(&self) -> Result<()> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let Built {
            worker,
            services,
            singletons,
            membership,
        } = take_built(&mut parts, "start")?;
        let services = self.spawn_services(services, singletons, membership);
        *parts = Parts::Running {
            worker: tokio::spawn(worker.run()),
            services,
        };
        Ok(())
    }

    /// Runs the worker until no job is due, with the services beside it,
    /// then stops them all and closes the store's listener: for scripts,
    /// tests and batch runs. Refused if the client was started already.
    pub async fn run_until_empty(&self) -> Result<WorkerSummary> {
        let built = {
            let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
            take_built(&mut parts, "run_until_empty")?
        };
        let Built {
            worker,
            services,
            singletons,
            membership,
        } = built;
        let services = self.spawn_services(services, singletons, membership);
        let summary = worker.run_until_empty().await;
        self.stop.cancel();
        join_services(services).await;
        // Nothing runs on this client again: its listener goes now.
        self.store.close().await;
        Ok(summary)
    }

    /// Stops the worker (no new claim; running jobs get the worker's
    /// `drain_timeout` to finish, then are canceled and handed back) and
    /// every service, waits for them, and closes the store's listener.
    /// Returns what the worker did; `None` for a client never started (or
    /// stopped already).
    pub async fn shutdown(&self) -> Result<Option<WorkerSummary>> {
        self.shutdown.graceful();
        self.stop.cancel();
        let parts = {
            let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *parts, Parts::Stopped)
        };
        let summary = match parts {
            Parts::Running { worker, services } => {
                // The services are stopped and waited for, and the listener
                // closed, whatever became of the worker's task.
                let ran = worker.await;
                join_services(services).await;
                Some(ran.map_err(|e| Error::InvalidOption {
                    field: "worker",
                    reason: format!("the worker's task ended abnormally: {e}"),
                }))
            }
            Parts::Built(built) => {
                // Never started: its registry row goes now.
                if let Some(m) = built.membership {
                    let _ = m.node.deregister().await;
                }
                None
            }
            Parts::Stopped => None,
        };
        self.store.close().await;
        summary.transpose()
    }

    /// Starts the services, and the singletons: under the election in a
    /// cluster, else at once.
    fn spawn_services(
        &self,
        services: Vec<Starter>,
        singletons: Vec<LeaderStarter>,
        membership: Option<Membership>,
    ) -> Vec<JoinHandle<()>> {
        let mut running: Vec<JoinHandle<()>> = services
            .into_iter()
            .map(|start| start(self.stop.clone()))
            .collect();
        match membership {
            Some(m) => running.extend(m.spawn(singletons, &self.stop)),
            None => running.extend(
                singletons
                    .into_iter()
                    .map(|start| tokio::spawn(start(Run::Always(self.stop.clone())))),
            ),
        }
        running
    }
}

/// The parts of a client not yet started, taken out; refused (and left as
/// they are) once it was.
fn take_built(parts: &mut Parts, what: &'static str) -> Result<Built> {
    match std::mem::replace(parts, Parts::Stopped) {
        Parts::Built(built) => Ok(*built),
        other => {
            *parts = other;
            Err(Error::InvalidOption {
                field: what,
                reason: "the client was started already".into(),
            })
        }
    }
}

/// `service`, to run on its own task when the client starts; an error is
/// logged with its name.
fn starter(service: impl Service) -> Starter {
    Box::new(move |stop| {
        tokio::spawn(async move {
            if let Err(err) = service.run(stop).await {
                tracing::error!(service = service.name(), error = %err, "a client's service stopped");
            }
        })
    })
}

async fn join_services(services: Vec<JoinHandle<()>>) {
    for service in services {
        if let Err(err) = service.await {
            tracing::error!(error = %err, "a client's service ended abnormally");
        }
    }
}

/// How old a node's heartbeat (and its job's) must be before the resetter
/// takes its jobs back: its `dead_after`, but never before the node's worker
/// has stopped them itself. A worker cut off from the database cancels its
/// jobs at most `heartbeat_failure_limit` plus three of its heartbeat
/// intervals after the last beat the database recorded (a failing round
/// sleeps an interval and waits an interval for its beat's timeout; the
/// store checks the same sum against `stalled_max_age`). Requeued sooner, a
/// job cut off for a while would run twice at once. (Without a limit,
/// allowed only in transactional handling, the job's row lock holds it
/// until the worker's connection is gone.)
fn orphaned_after(
    dead_after: Duration,
    failure_limit: Option<Duration>,
    worker_heartbeat: Duration,
) -> Duration {
    match failure_limit {
        Some(limit) => dead_after.max(limit.saturating_add(worker_heartbeat.saturating_mul(3))),
        None => dead_after,
    }
}

#[cfg(test)]
mod orphan_tests {
    use super::*;

    #[test]
    fn a_node_is_orphaned_only_once_its_worker_stopped_its_jobs() {
        let s = Duration::from_secs;
        // The defaults: dead after 10 s, a worker stops its jobs at most
        // 15 s and three 1 s rounds after its last recorded heartbeat.
        assert_eq!(orphaned_after(s(10), Some(s(15)), s(1)), s(18));
        // A slow heartbeat: each failing round takes two of its intervals.
        assert_eq!(orphaned_after(s(10), Some(s(15)), s(10)), s(45));
        assert_eq!(orphaned_after(s(60), Some(s(15)), s(1)), s(60));
        assert_eq!(orphaned_after(s(10), None, s(1)), s(10));
    }
}
