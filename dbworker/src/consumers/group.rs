//! Checkpointed log consumers across processes: each process runs a
//! `ConsumerGroup` with the same consumers; the leader of the group's scope
//! assigns consumers to the live processes that run the group (its members,
//! see `rebalance.rs`) round-robin (sorted names over sorted node ids) and
//! rebalances when processes join or leave or die; every process runs the
//! slices of the consumers assigned to it through a `Worker` over a
//! [`LogStore`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;
use workerutil::{Handler, HandlerError, JobContext, Worker, WorkerOptions};

use super::books::Recheck;
use super::consumer::{AnyConsumer, Consumers};
use super::dispatcher::{DispatcherOptions, LogDispatcher};
use super::options::{LogEvent, LogOptions};
use super::rebalance::{Membership, Rebalancer, member_table};
use crate::cluster::leader::{LeaderElection, LeaderOptions};
use crate::columns::Relation;
use crate::consumers::store::{LogJob, LogStore};
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql;

/// Runs each slice with the consumer it belongs to.
struct Dispatch<E> {
    consumers: HashMap<String, Arc<dyn AnyConsumer<E>>>,
}

impl<E> Handler<LogStore<E>> for Dispatch<E>
where
    E: LogEvent,
{
    async fn handle(
        &self,
        job: &mut LogJob<E>,
        _ctx: &JobContext<LogStore<E>>,
    ) -> std::result::Result<(), HandlerError> {
        if let Some(problem) = &job.slice().problem {
            return Err(HandlerError::non_retryable(problem.clone()));
        }
        let consumer = self
            .consumers
            .get(&job.slice().consumer)
            .cloned()
            .ok_or_else(|| HandlerError::non_retryable("no such consumer in this process"))?;
        let span = tracing::info_span!(
            "consumer",
            consumer = consumer.name(),
            after = job.slice().after
        );
        let _entered = span.enter();
        // Take the events out so the transaction can be borrowed mutably.
        let events = std::mem::take(job.events_mut());
        let mut result = Ok(());
        if let Some(tx) = job.tx() {
            for event in &events {
                if let Err(err) = consumer.handle(tx, event).await {
                    result = Err(HandlerError::retryable(err));
                    break;
                }
            }
        } else {
            result = Err(HandlerError::non_retryable("the slice has no transaction"));
        }
        *job.events_mut() = events;
        result
    }
}

/// How a process runs its share of a group's consumers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerGroupOptions {
    /// The group's name: its leader scope is `consumers:<name>`.
    pub name: String,
    /// How the log is read (events table, position column, slice size, pause,
    /// retry wait, failure limit, NOTIFY channel). Its `node_id` and
    /// `consumers` are filled in by the group.
    pub log: LogOptions,
    /// The node running this part of the group (its registry id, `Node::id`,
    /// which the caller keeps heartbeating with `Node::run`). Required.
    pub node_id: String,
    /// The worker registry table (`Node`'s). Default `dbworker_nodes`.
    pub node_table: String,
    /// A process whose registry heartbeat (or membership of the group, kept
    /// fresh every `rebalance_interval`) is older than this gets no
    /// consumers. Default 10 s (as `NodeOptions::dead_after`).
    pub dead_after: Duration,
    /// The lease table. Default `dbworker_leaders`.
    pub leader_table: String,
    /// The leader's lease (see `LeaderOptions::lease`). Default 6 s.
    pub lease: Duration,
    /// How often the leader rebalances. At most 15 s. Default 2 s.
    pub rebalance_interval: Duration,
    /// A slice running longer is rolled back and counts as a failure.
    /// Default 30 s.
    pub slice_timeout: Duration,
    /// Poll mode (no `log.listen`): how often the process's dispatcher reads
    /// the log's head (one statement, shared by every group of the process on
    /// the same events table and settings; consumers behind the head are then
    /// woken). Also how often the group looks at its consumers' books, in
    /// memory. At least 10 ms. Default 200 ms.
    pub poll_interval: Duration,
    /// Notify mode (`log.listen` set): the dispatcher reads the head on each
    /// notification and at least this often, so an event whose NOTIFY was
    /// lost is still handled within about this bound. Default 1 s.
    pub reconcile_interval: Duration,
    /// While looking at the books finds nothing to do, the group's wait
    /// doubles from `poll_interval` up to this (the dispatcher's wake-up, when
    /// the head moves, resets it). Default 30 s.
    pub max_poll_interval: Duration,
    /// A consumer the head says is caught up is still asked about in the
    /// database this often (say, a checkpoint moved by hand). Default 30 s.
    pub recheck_interval: Duration,
}

impl ConsumerGroupOptions {
    /// A group `name` over `events_table`, with defaults.
    pub fn new(name: impl Into<String>, events_table: impl Into<String>) -> Self {
        let name = name.into();
        ConsumerGroupOptions {
            log: LogOptions::new(name.clone(), events_table, String::new(), Vec::new()),
            name,
            node_id: String::new(),
            node_table: crate::cluster::nodes::DEFAULT_NODE_TABLE.into(),
            dead_after: Duration::from_secs(10),
            leader_table: crate::cluster::leader::DEFAULT_LEADER_TABLE.into(),
            lease: Duration::from_secs(6),
            rebalance_interval: Duration::from_secs(2),
            slice_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_millis(200),
            reconcile_interval: Duration::from_secs(1),
            max_poll_interval: Duration::from_secs(30),
            recheck_interval: Duration::from_secs(30),
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.name.trim().is_empty() {
            return invalid("name", "must not be empty");
        }
        if self.node_id.trim().is_empty() {
            return invalid(
                "node_id",
                "must not be empty: set it to the node's `Node::id`",
            );
        }
        Relation::parse("node_table", &self.node_table)?;
        Relation::parse("leader_table", &self.leader_table)?;
        Error::check_max_durations([
            ("dead_after", self.dead_after),
            ("lease", self.lease),
            ("rebalance_interval", self.rebalance_interval),
            ("slice_timeout", self.slice_timeout),
            ("poll_interval", self.poll_interval),
            ("reconcile_interval", self.reconcile_interval),
            ("max_poll_interval", self.max_poll_interval),
            ("recheck_interval", self.recheck_interval),
        ])?;
        if self.slice_timeout.is_zero() {
            return invalid("slice_timeout", "must be positive");
        }
        // The group's worker polls at it: the worker's minimum, named here.
        if self.poll_interval < workerutil::MIN_INTERVAL {
            return invalid(
                "poll_interval",
                &format!("must be at least {:?}", workerutil::MIN_INTERVAL),
            );
        }
        if self.reconcile_interval < Duration::from_millis(1) {
            return invalid("reconcile_interval", "must be at least 1 ms");
        }
        if self.recheck_interval < Duration::from_millis(1) {
            return invalid("recheck_interval", "must be at least 1 ms");
        }
        if self.rebalance_interval.is_zero() {
            return invalid("rebalance_interval", "must be positive");
        }
        // The group's worker heartbeats at it, and refuses a heartbeat longer
        // than its default `heartbeat_failure_limit`: named here instead.
        if let Some(limit) = WorkerOptions::new("").heartbeat_failure_limit
            && self.rebalance_interval > limit
        {
            return invalid(
                "rebalance_interval",
                &format!(
                    "must be at most {} (the group's worker heartbeats at it)",
                    workerutil::duration::format(limit)
                ),
            );
        }
        Ok(())
    }
}

/// A process's part of a consumer group.
///
/// ```no_run
/// # use dbworker::{consumers::{Consumer, ConsumerGroup, ConsumerGroupOptions, Consumers}, cluster::{Node, NodeOptions}};
/// # #[derive(sqlx::FromRow)] struct Event { global_position: i64 }
/// # struct Projection;
/// # impl Consumer<Event> for Projection {
/// #     fn name(&self) -> &str { "orders" }
/// #     async fn handle(&self, _tx: &mut sqlx::PgConnection, _e: &Event) -> Result<(), workerutil::BoxError> { Ok(()) }
/// # }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// let node = Node::new(&pool, NodeOptions::default()).await?;
/// let stop = tokio_util::sync::CancellationToken::new();
/// tokio::spawn(node.clone().run(stop.clone()));
/// let mut options = ConsumerGroupOptions::new("projections", "events");
/// options.node_id = options.node_id.clone();
/// let group = ConsumerGroup::<Event>::new(&pool, options, Consumers::new().add(Projection))
///     .await?;
/// group.run(stop).await?; // Err when a consumer keeps failing
/// # Ok(()) }
/// ```
pub struct ConsumerGroup<E: LogEvent> {
    store: Arc<LogStore<E>>,
    dispatcher: LogDispatcher,
    worker: Worker<LogStore<E>, Dispatch<E>>,
    election: LeaderElection,
    names: Vec<String>,
    options: ConsumerGroupOptions,
    assignments: Relation,
    nodes: Relation,
    membership: Membership,
}

impl<E: LogEvent> std::fmt::Debug for ConsumerGroup<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerGroup")
            .field("name", &self.options.name)
            .field("consumers", &self.names)
            .finish_non_exhaustive()
    }
}

impl<E> ConsumerGroup<E>
where
    E: LogEvent,
{
    /// This process's part of the group, run by the node `options.node_id`,
    /// with the handler of each consumer. The pool needs a connection per
    /// consumer plus two.
    pub async fn new(
        pool: &PgPool,
        options: ConsumerGroupOptions,
        consumers: Consumers<E>,
    ) -> Result<ConsumerGroup<E>> {
        options.validate()?;
        let consumers = consumers.list;
        let mut names: Vec<String> = consumers.iter().map(|c| c.name().to_owned()).collect();
        names.sort();
        let mut log = options.log.clone();
        log.node_id = options.node_id.clone();
        log.consumers = names.clone();
        log.name = options.name.clone();
        log.scopes = consumers
            .iter()
            .map(|c| (c.name().to_owned(), c.aggregate_types()))
            .filter(|(_, types)| !types.is_empty())
            .collect();
        // The process's dispatcher reads the head and listens; the store asks
        // only about consumers behind it.
        let mut d = DispatcherOptions::new(log.events_table.clone());
        d.position_column = log.position_column.clone();
        d.transaction_column = log.transaction_column.clone();
        d.poll_interval = options.poll_interval;
        d.listen = log.listen.take();
        d.reconcile_interval = options.reconcile_interval;
        d.connect_timeout = log.connect_timeout;
        let dispatcher = LogDispatcher::new(pool, d).await?;
        let mut store = LogStore::new(pool, log.clone()).await?;
        store.dispatched_by(
            dispatcher.clone(),
            Recheck {
                unheld: options.rebalance_interval,
                always: options.recheck_interval,
            },
        );
        let store = Arc::new(store);
        let mut wo = WorkerOptions::new(format!("consumers:{}", options.name));
        wo.num_handlers = names.len();
        wo.hostname = Some(options.node_id.clone());
        wo.interval = options.poll_interval;
        wo.max_interval = Some(options.max_poll_interval.max(options.poll_interval));
        wo.max_runtime_per_job = Some(options.slice_timeout);
        wo.heartbeat_interval = options.rebalance_interval;
        let dispatch = Dispatch {
            consumers: consumers
                .into_iter()
                .map(|c| (c.name().to_owned(), c))
                .collect(),
        };
        let worker = Worker::new(store.clone(), dispatch, wo)?;
        let mut lo = LeaderOptions::new(
            format!("consumers:{}", options.name),
            options.node_id.clone(),
        );
        lo.leader_table = options.leader_table.clone();
        lo.lease = options.lease;
        let election = LeaderElection::new(pool, lo).await?;
        let assignments = Relation::parse("assignment_table", &log.assignment_table)?;
        let nodes = Relation::parse("node_table", &options.node_table)?;
        let members = member_table(&assignments);
        let mut problems = crate::schema_check::missing_columns(
            pool,
            &members,
            "group members table",
            &["group_name", "node_id", "heartbeat_at"],
            "`dbworker migration --consumers` prints it",
        )
        .await?;
        // Any process may lead, and the leader assigns the consumers to the
        // live members; every process keeps its own membership.
        problems.extend(
            Grants::new("rebalancing a consumer group")
                .on(
                    "assignment table",
                    &assignments,
                    &[Privilege::Select, Privilege::Insert, Privilege::Update],
                )
                .on("node table", &nodes, &[Privilege::Select])
                .on(
                    "group members table",
                    &members,
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
        let membership = Membership {
            pool: pool.clone(),
            members,
            group: options.name.clone(),
            node_id: options.node_id.clone(),
            interval: options.rebalance_interval,
        };
        Ok(ConsumerGroup {
            store,
            dispatcher,
            worker,
            election,
            names,
            assignments,
            nodes,
            membership,
            options,
        })
    }

    /// The process's dispatcher this group shares (to see its head reads).
    pub fn dispatcher(&self) -> &LogDispatcher {
        &self.dispatcher
    }

    /// Runs until `stop` fires (returning `Ok`) or a consumer fails
    /// `max_consecutive_failures` slices in a row (returning
    /// `Error::ConsumerFailed` after stopping everything): the slices of the
    /// consumers assigned here and, while this process leads, the rebalancing.
    /// The same as [`Service::run`](crate::Service::run), for a group its
    /// task owns.
    pub async fn run(self, stop: CancellationToken) -> Result<()> {
        self.run_group(stop).await
    }

    async fn run_group(&self, stop: CancellationToken) -> Result<()> {
        let failed = self.store.stopped();
        let shutdown = self.worker.shutdown_handle();
        // A member before anyone deals to it; the refresh stops (and the
        // membership is removed) as soon as the group stops, before the drain.
        // A failed first beat stops nothing: the refresh below tries again,
        // and a process not yet a member is dealt nothing meanwhile.
        if let Err(err) = self.membership.beat().await {
            tracing::warn!(group = %self.options.name, error = %err,
                "joining the group failed; the membership refresh will retry");
        }
        let member_stop = CancellationToken::new();
        // Dropped mid-run (an aborted task), the refresh must not outlive it.
        let _refresh_guard = member_stop.clone().drop_guard();
        let mut refresh = {
            let (membership, stop) = (self.membership.clone(), member_stop.clone());
            tokio::spawn(async move { membership.run(&stop).await })
        };
        let rebalancer = Rebalancer {
            group: self.options.name.clone(),
            names: self.names.clone(),
            assignments: self.assignments.clone(),
            nodes: self.nodes.clone(),
            members: self.membership.members.clone(),
            interval: self.options.rebalance_interval,
            dead_after: self.options.dead_after,
        };
        let rebalance = {
            let (stop, election) = (stop.clone(), self.election.clone());
            tokio::spawn(async move {
                election
                    .run(stop, move |leading| {
                        let rebalancer = rebalancer.clone();
                        async move { rebalancer.run(&leading).await }
                    })
                    .await;
            })
        };
        // The worker stops through its handle: gracefully with `stop`, at
        // once on a consumer's failure.
        let watch = async {
            let stopped_by_failure = tokio::select! {
                () = stop.cancelled() => false,
                () = failed.cancelled() => true,
            };
            if stopped_by_failure {
                shutdown.immediate();
            } else {
                shutdown.graceful();
            }
            member_stop.cancel();
            let _ = (&mut refresh).await;
            self.membership.leave().await;
            stopped_by_failure
        };
        let (ran, stopped_by_failure) =
            tokio::join!(self.worker.run_until(CancellationToken::new()), watch);
        ran?;
        // The election stops with `stop`; on a failure stop it here too.
        if stopped_by_failure {
            rebalance.abort();
        }
        let _ = rebalance.await;
        match self.store.fatal() {
            Some(f) => Err(Error::ConsumerFailed {
                consumer: f.consumer,
                failures: f.failures,
                message: f.message,
            }),
            None => Ok(()),
        }
    }
}

/// A consumer group is a service: it runs once, until `stop` fires or a
/// consumer fails for good (see [`ConsumerGroup::run`]).
impl<E: LogEvent> crate::Service for ConsumerGroup<E> {
    fn name(&self) -> &str {
        &self.options.name
    }

    async fn run(&self, stop: CancellationToken) -> Result<()> {
        self.run_group(stop).await
    }
}

/// Each consumer's checkpoint, the log's last position, and the lag between.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerLag {
    /// The consumer.
    pub consumer: String,
    /// Its checkpoint.
    pub last_position: i64,
    /// The log's last position.
    pub latest: i64,
}

impl ConsumerLag {
    /// Positions behind (not necessarily events, if positions have gaps).
    pub fn lag(&self) -> i64 {
        self.latest - self.last_position
    }
}

/// The lag of every consumer with a checkpoint in `checkpoint_table`.
pub async fn consumer_lag(
    pool: &PgPool,
    events_table: &str,
    position_column: &str,
    checkpoint_table: &str,
) -> Result<Vec<ConsumerLag>> {
    let events = Relation::parse("events_table", events_table)?;
    let checkpoints = Relation::parse("checkpoint_table", checkpoint_table)?;
    let position_column = crate::columns::column_name("position_column", position_column)?;
    let rows = sql::log_lag(&events, &position_column, &checkpoints)
        .fetch_all(pool)
        .await
        .map_err(Error::db("log_lag"))?;
    Ok(rows
        .iter()
        .map(|r| ConsumerLag {
            consumer: r.get("consumer_name"),
            last_position: r.get("last_position"),
            latest: r.get("latest"),
        })
        .collect())
}

/// Every consumer's process, from `assignment_table`: `(consumer, node id)`.
pub async fn consumer_assignments(
    pool: &PgPool,
    assignment_table: &str,
) -> Result<Vec<(String, String)>> {
    let table = Relation::parse("assignment_table", assignment_table)?;
    let rows = sql::log_assignments(&table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("log_assignments"))?;
    Ok(rows
        .iter()
        .map(|r| (r.get("consumer_name"), r.get("node_id")))
        .collect())
}
