//! The worker registry: each process registers a row (id, host, pid,
//! version, queues, handlers), heartbeats it, and deletes it on a graceful
//! stop. A row whose heartbeat is older than `dead_after` (database clock) is
//! a dead process: `dbworker status` stops listing it, and a resetter that
//! knows the registry requeues its jobs at once instead of waiting for
//! `stalled_max_age`.

use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::metrics::NODES_LIVE;
use crate::runner::{Next, Pass, Runner};
use crate::sql;

/// The registry table's default name.
pub const DEFAULT_NODE_TABLE: &str = "dbworker_nodes";

/// What is wrong with the registry table `rel` (missing, or missing columns).
pub(crate) async fn problems(pool: &PgPool, rel: &Relation) -> Result<Vec<String>> {
    crate::schema_check::missing_columns(
        pool,
        rel,
        "node table",
        &[
            "id",
            "host",
            "pid",
            "version",
            "queues",
            "handlers",
            "started_at",
            "heartbeat_at",
        ],
        "`dbworker migration --nodes` prints it",
    )
    .await
}

/// How a process registers itself.
///
/// Deserializable from a config file: every field left out keeps its
/// default, durations are written as in [`workerutil::duration`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeOptions {
    /// The registry table. Default [`DEFAULT_NODE_TABLE`].
    pub node_table: String,
    /// Time between the process's heartbeats. Default 2 s.
    #[serde(with = "workerutil::duration")]
    pub heartbeat_interval: Duration,
    /// A process whose heartbeat is older than this is dead. Default 10 s;
    /// at least three heartbeat intervals, so one slow heartbeat never
    /// declares a live process dead.
    #[serde(with = "workerutil::duration")]
    pub dead_after: Duration,
    /// The queues the process serves, for operators (informational).
    pub queues: Vec<String>,
    /// Its handler count, for operators (informational).
    pub handlers: u32,
    /// Its version, for operators. Default: this crate's version.
    pub version: String,
    /// The host name recorded. Default: the machine's host name.
    pub host: Option<String>,
    /// The control tables its workers' claims honour, for operators (the
    /// CLI's `status`, the dashboard's processes page):
    /// [`JobTable::honours`](crate::JobTable::honours) of each table it
    /// works. Stored when the node table has the `honours` column
    /// (`dbworker migration --nodes` adds it).
    pub honours: Vec<String>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_table: DEFAULT_NODE_TABLE.to_owned(),
            heartbeat_interval: Duration::from_secs(2),
            dead_after: Duration::from_secs(10),
            queues: Vec::new(),
            handlers: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            host: None,
            honours: Vec::new(),
        }
    }
}

impl NodeOptions {
    /// What the registry stores about this process; `honours` only where
    /// the node table has the column.
    fn row<'a>(&'a self, host: &'a str, pid: i32, honours: bool) -> sql::NodeRow<'a> {
        sql::NodeRow {
            host,
            pid,
            version: &self.version,
            queues: &self.queues,
            handlers: self.handlers,
            honours: honours.then_some(self.honours.as_slice()),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        Relation::parse("node_table", &self.node_table)?;
        if self.heartbeat_interval < Duration::from_millis(10) {
            return invalid("heartbeat_interval", "must be at least 10ms");
        }
        // Multiplied and added to the clock below and at run time.
        for (field, duration) in [
            ("heartbeat_interval", self.heartbeat_interval),
            ("dead_after", self.dead_after),
        ] {
            if duration > workerutil::duration::MAX {
                return invalid(field, "must be at most 100 years");
            }
        }
        if self.dead_after < self.heartbeat_interval * 3 {
            return invalid("dead_after", "must be at least three heartbeat intervals");
        }
        if i32::try_from(self.handlers).is_err() {
            return invalid("handlers", "is too large");
        }
        Ok(())
    }
}

/// A live process as the registry lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NodeInfo {
    /// The process's id (what its workers write in `worker_hostname`).
    pub id: String,
    /// Its host name.
    pub host: String,
    /// Its process id on that host.
    pub pid: i32,
    /// Its version.
    pub version: String,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// Its handler count.
    pub handlers: i32,
    /// Seconds since it started (database clock).
    pub up_seconds: f64,
    /// Seconds since its last heartbeat (database clock).
    pub heartbeat_age_seconds: f64,
    /// The control tables its workers honour (`NodeOptions::honours`);
    /// `None` when it did not say (a version before the `honours` column,
    /// or a node table without it): its workers may ignore pauses.
    pub honours: Option<Vec<String>>,
}

/// This process's registration. Give its [`id`](Node::id) to every worker as
/// `WorkerOptions::hostname`, so the jobs it claims name it, and run
/// [`run`](Node::run) beside the workers.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::cluster::{Node, NodeOptions};
/// let node = Node::new(&pool, NodeOptions::default()).await?;
/// let mut worker_options = workerutil::WorkerOptions::new("emails");
/// worker_options.hostname = Some(node.id().to_owned());
/// let stop = tokio_util::sync::CancellationToken::new();
/// tokio::spawn(node.clone().run(stop.clone())); // deregisters when `stop` fires
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Node {
    pool: PgPool,
    table: Relation,
    id: String,
    host: String,
    pid: i32,
    options: NodeOptions,
    /// The node table has the `honours` column.
    has_honours: bool,
}

impl Node {
    /// Registers this process (the table must exist) and returns its node.
    pub async fn new(pool: &PgPool, options: NodeOptions) -> Result<Node> {
        options.validate()?;
        let table = Relation::parse("node_table", &options.node_table)?;
        let mut problems = problems(pool, &table).await?;
        // Registering inserts the row, heartbeats upsert it, a graceful stop
        // deletes it.
        problems.extend(
            Grants::new("registering this process")
                .on(
                    "node table",
                    &table,
                    &[
                        Privilege::Select,
                        Privilege::Insert,
                        Privilege::Update,
                        Privilege::Delete,
                    ],
                )
                .problems(pool)
                .await?,
        );
        crate::schema_check::none(problems)?;
        let host = match &options.host {
            Some(h) => h.clone(),
            None => hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into()),
        };
        let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let has_honours = crate::schema_check::columns_of(pool, &table)
            .await?
            .contains_key("honours");
        let id: String = sql::node_register(&table, options.row(&host, pid, has_honours))
            .fetch_one(pool)
            .await
            .map_err(Error::db("node_register"))?
            .get("id");
        tracing::info!(node = %id, "registered in the worker registry");
        Ok(Node {
            pool: pool.clone(),
            table,
            id,
            host,
            pid,
            options,
            has_honours,
        })
    }

    /// The process's id: `host:pid:random`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Records a heartbeat now (registering again if the row was removed).
    pub async fn heartbeat(&self) -> Result<()> {
        sql::node_heartbeat(
            &self.table,
            &self.id,
            self.options.row(&self.host, self.pid, self.has_honours),
        )
        .execute(&self.pool)
        .await
        .map_err(Error::db("node_heartbeat"))?;
        Ok(())
    }

    /// Heartbeats every `heartbeat_interval` until `stop` fires, then
    /// deregisters. A failed heartbeat is logged and retried.
    pub async fn run(mut self, stop: CancellationToken) {
        // A steady rate from each heartbeat's start, and no back-off: the row
        // must be fresh again as soon as the database is back, or the process
        // would pass for dead (`dead_after`) and have its jobs requeued.
        Runner::every(self.options.heartbeat_interval)
            .steady_rate()
            .run(&stop, &mut self)
            .await;
        if let Err(err) = self.deregister().await {
            tracing::warn!(node = %self.id, error = %err, "deregistering failed; the row ages out");
        }
    }

    /// Removes this process's row (a graceful stop).
    pub async fn deregister(&self) -> Result<()> {
        sql::node_deregister(&self.table, &self.id)
            .execute(&self.pool)
            .await
            .map_err(Error::db("node_deregister"))?;
        Ok(())
    }
}

/// The registry row as a service: heartbeats until `stop` fires, then
/// deregisters (as [`Node::run`] on a clone).
impl crate::Service for Node {
    fn name(&self) -> &str {
        "node"
    }

    async fn run(&self, stop: CancellationToken) -> Result<()> {
        Node::run(self.clone(), stop).await;
        Ok(())
    }
}

/// The node as the runner sees it: one heartbeat per pass.
impl Pass for Node {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("node", node = %self.id)
    }

    /// One heartbeat, then the live-node gauge.
    async fn pass(&mut self) -> Next {
        match self.heartbeat().await {
            Ok(()) => {
                if let Ok(live) = live_nodes(
                    &self.pool,
                    &self.options.node_table,
                    self.options.dead_after,
                )
                .await
                {
                    #[allow(clippy::cast_precision_loss)] // a few processes
                    metrics::gauge!(NODES_LIVE).set(live.len() as f64);
                }
            }
            Err(err) => {
                tracing::warn!(node = %self.id, error = %err, "node heartbeat failed; will retry")
            }
        }
        Next::Interval
    }
}

/// The processes of `node_table` whose heartbeat is younger than `dead_after`
/// (database clock), by id.
pub async fn live_nodes(
    pool: &PgPool,
    node_table: &str,
    dead_after: Duration,
) -> Result<Vec<NodeInfo>> {
    let table = Relation::parse("node_table", node_table)?;
    let rows = sql::nodes_live(&table, dead_after)
        .fetch_all(pool)
        .await
        .map_err(Error::db("nodes_live"))?;
    Ok(rows.iter().map(node_info).collect())
}

/// Every process `node_table` still holds, live or dead (a dead one stays
/// until pruned), by id: compare each heartbeat age with `dead_after`.
pub async fn registered_nodes(pool: &PgPool, node_table: &str) -> Result<Vec<NodeInfo>> {
    let table = Relation::parse("node_table", node_table)?;
    let rows = sql::nodes_all(&table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("nodes_all"))?;
    Ok(rows.iter().map(node_info).collect())
}

fn node_info(r: &sqlx::postgres::PgRow) -> NodeInfo {
    NodeInfo {
        id: r.get("id"),
        host: r.get("host"),
        pid: r.get("pid"),
        version: r.get("version"),
        queues: r.get("queues"),
        handlers: r.get("handlers"),
        up_seconds: r.get("up"),
        heartbeat_age_seconds: r.get("age"),
        honours: r
            .get::<Option<serde_json::Value>, _>("honours")
            .and_then(|v| serde_json::from_value(v).ok()),
    }
}
