//! One process of a cluster, as an application would run it on each host:
//! it registers in the worker registry, runs a transactional job worker on
//! `jobs` (each job's effect written in its transaction), its share of the
//! `projections` consumer group (four consumers) over `events`, and — only
//! while it leads — the resetter with the fast rescue of dead processes' jobs,
//! the queue gauges and retention. Runs until SIGINT or SIGTERM (or SIGKILL).
//!
//! By default it sets up a scratch database with the tables, jobs and events,
//! runs one node until the work is done, and prints a summary; like every
//! example, it creates that database on the `DATABASE_URL` server if the
//! variable is set, or on a throwaway cluster otherwise. With `--join URL` it
//! joins the cluster on the database at `URL` instead and runs until stopped
//! (the tables must exist: `--setup --join URL` creates them, with 2,000 jobs
//! and 2,000 events, and exits); the network-namespace test (`tests/examples/netns.rs`)
//! and `scripts/netns-cluster.sh` start several this way, one per namespace.
//!
//! ```sh
//! cargo run --example cluster_node
//! cargo run --example cluster_node -- --setup --join postgres://…/cluster
//! cargo run --example cluster_node -- --join postgres://…/cluster   # on each host
//! ```

use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Handling, JobTable, JobTableOptions, QueueGauges, Resetter, ResetterOptions,
    Service, StoreOptions,
    cluster::{
        DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, LeaderElection, LeaderOptions, Node, NodeOptions,
    },
    consumers::{
        Consumer, ConsumerGroup, ConsumerGroupOptions, Consumers, DEFAULT_ASSIGNMENT_TABLE,
        DEFAULT_CHECKPOINT_TABLE,
    },
    ddl::{consumer_tables_sql, events_table_sql, job_table_sql, leader_table_sql, node_table_sql},
    maintenance::{PurgeOptions, Purger},
    new_worker,
};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use workerutil::{BoxError, Handler, HandlerError, JobContext, JobState, Record, WorkerOptions};

#[derive(Debug, sqlx::FromRow)]
struct Job {
    id: i64,
}

impl Record for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Writes the job's effect in its transaction: it commits with the job's
/// completion or not at all.
struct Effect(String);
impl Handler<DbStore<Job>> for Effect {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let tx = job
            .tx()
            .ok_or_else(|| HandlerError::non_retryable("no transaction"))?;
        sqlx::query("INSERT INTO effects (job_id, node) VALUES ($1, $2)")
            .bind(id)
            .bind(&self.0)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(HandlerError::retryable)?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

#[derive(Debug, sqlx::FromRow)]
struct Event {
    global_position: i64,
}

/// Four consumers: on up to four processes each gets at least one.
const CONSUMERS: [&str; 4] = ["audit", "billing", "crm", "totals"];

struct Project(&'static str);
impl Consumer<Event> for Project {
    fn name(&self) -> &str {
        self.0
    }

    async fn handle(&self, tx: &mut PgConnection, event: &Event) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO projection (consumer, position) VALUES ($1, $2)")
            .bind(self.0)
            .bind(event.global_position)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Creates the tables, and `jobs` jobs and `events` events.
async fn setup(pool: &PgPool, jobs: i64, events: i64) -> Result<(), BoxError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "{}{}{}{}{}
         CREATE TABLE IF NOT EXISTS effects (job_id bigint NOT NULL, node text NOT NULL);
         CREATE TABLE IF NOT EXISTS projection (consumer text NOT NULL, position bigint NOT NULL);
         INSERT INTO jobs (state) SELECT 'queued' FROM generate_series(1, {jobs});
         INSERT INTO events (aggregate_type, aggregate_id, event_type)
         SELECT 'order', 'o' || i, 'placed' FROM generate_series(1, {events}) AS i;",
        job_table_sql("jobs", &Default::default())?,
        node_table_sql(DEFAULT_NODE_TABLE)?,
        leader_table_sql(DEFAULT_LEADER_TABLE)?,
        consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE)?,
        events_table_sql("events", "events_appended")?,
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// Runs this node until `stop` fires.
async fn run_node(pool: PgPool, stop: CancellationToken) -> Result<(), BoxError> {
    // The job table, checked once; the store, the resetter and the purger take it.
    let table = JobTable::new(&pool, JobTableOptions::new("jobs j")).await?;
    let mut no = NodeOptions::default();
    no.heartbeat_interval = Duration::from_millis(200);
    no.dead_after = Duration::from_secs(1);
    no.queues = vec!["jobs".into()];
    no.handlers = 4;
    // Operators see what its claims honour (`dbworker status`, the dashboard).
    no.honours = table.honours();
    let node = Node::new(&pool, no).await?;
    println!("node {}", node.id());
    let beat = tokio::spawn(node.clone().run(stop.clone()));
    let mut so = StoreOptions::new("jobs");
    so.handling = Handling::Transactional;
    so.stall.stalled_max_age = Duration::from_secs(30);
    // Only the leader resets (below): jobs stalled as the store counts them,
    // and at once those of processes the registry shows dead.
    let mut ro = ResetterOptions::new("jobs_resetter");
    ro.stall = so.stall.clone();
    ro.interval = Duration::from_millis(300);
    ro.node_table = Some(DEFAULT_NODE_TABLE.into());
    ro.dead_after = Duration::from_secs(1);
    let resetter = Arc::new(Resetter::new(&pool, &table, ro).await?);
    let store = Arc::new(DbStore::new(&pool, &table, so).await?);
    let mut wo = WorkerOptions::new("jobs");
    wo.hostname = Some(node.id().to_owned());
    wo.num_handlers = 4;
    wo.interval = Duration::from_millis(100);
    let worker = new_worker(store.clone(), Effect(node.id().to_owned()), wo)?;
    let shutdown = worker.shutdown_handle();
    let jobs = tokio::spawn(worker.run());

    let mut lo = LeaderOptions::new("jobs", node.id());
    lo.lease = Duration::from_millis(1500);
    let election = LeaderElection::new(&pool, lo).await?;
    // Retention: finished jobs deleted an hour after they finished.
    let mut po = PurgeOptions::new();
    po.max_age = vec![
        (JobState::Completed, Duration::from_secs(3600)),
        (JobState::Failed, Duration::from_secs(3600)),
    ];
    let purger = Arc::new(Purger::new(&pool, &table, po).await?);
    let gauges = Arc::new(QueueGauges::new(store.clone(), Duration::from_secs(1))?);
    let leading = {
        let stop = stop.clone();
        let id = node.id().to_owned();
        tokio::spawn(async move {
            election
                .run(stop, move |leading| {
                    let (resetter, gauges, purger, id) =
                        (resetter.clone(), gauges.clone(), purger.clone(), id.clone());
                    // The leader's singleton services, until leadership ends;
                    // the writers fence every write by the leader's term.
                    async move {
                        println!("leader {id} (term {})", leading.term());
                        let _ = tokio::join!(
                            resetter.run_as_leader(leading.clone()),
                            gauges.run_as_leader(leading.clone()),
                            purger.run_as_leader(leading),
                        );
                    }
                })
                .await;
        })
    };

    let mut go = ConsumerGroupOptions::new("projections", "events");
    go.node_id = node.id().to_owned();
    go.dead_after = Duration::from_secs(1);
    go.lease = Duration::from_millis(1500);
    go.rebalance_interval = Duration::from_millis(200);
    go.poll_interval = Duration::from_millis(100);
    go.max_poll_interval = Duration::from_millis(500);
    go.log.slice_size = 50;
    go.log.slice_pause = Duration::from_millis(10);
    go.log.listen = Some("events_appended".into());
    let consumers: Consumers<Event> = CONSUMERS.iter().map(|&name| Project(name)).collect();
    let group = ConsumerGroup::new(&pool, go, consumers).await?;
    let consuming = tokio::spawn(group.run(stop.clone()));

    stop.cancelled().await;
    shutdown.graceful();
    jobs.await?;
    consuming.await??;
    leading.await?;
    beat.await?;
    store.close().await;
    Ok(())
}

async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The command line: `[--setup] [--join URL | --join=URL]`.
struct Args {
    setup: bool,
    /// The database of the cluster to join.
    join: Option<String>,
}

fn args() -> Result<Args, BoxError> {
    let mut parsed = Args {
        setup: false,
        join: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--setup" {
            parsed.setup = true;
        } else if arg == "--join" {
            parsed.join = Some(
                args.next()
                    .ok_or("--join needs the cluster's database URL")?,
            );
        } else if let Some(url) = arg.strip_prefix("--join=") {
            parsed.join = Some(url.to_owned());
        } else {
            return Err(format!(
                "unknown argument {arg:?}; usage: cluster_node [--setup] [--join URL]"
            )
            .into());
        }
    }
    if parsed.setup && parsed.join.is_none() {
        return Err(
            "--setup creates the tables on the cluster's database: give it with --join URL".into(),
        );
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args()?;
    if let Some(url) = args.join {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&url)
            .await?;
        if args.setup {
            let result = setup(&pool, 2000, 2000).await;
            pool.close().await;
            return result;
        }
        let stop = CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            signal().await;
            on_signal.cancel();
        });
        let result = run_node(pool.clone(), stop).await;
        pool.close().await;
        return result;
    }

    // Zero-config: one node on a throwaway database, until the work is done.
    let db = dbworker_testkit::TestDatabase::new().await?;
    let pool = db.pool(16).await?;
    setup(&pool, 200, 300).await?;
    let stop = CancellationToken::new();
    let node = tokio::spawn(run_node(pool.clone(), stop.clone()));
    loop {
        let (jobs, events): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM jobs WHERE state = 'completed'), \
                    (SELECT COALESCE(min(last_position), 0) FROM dbworker_consumer_checkpoints)",
        )
        .persistent(false)
        .fetch_one(&mut *pool.begin().await?)
        .await?;
        if jobs == 200 && events == 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    node.await??;
    let (effects, distinct, projected): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM effects), (SELECT count(DISTINCT job_id) FROM effects), \
                (SELECT count(*) FROM projection)",
    )
    .persistent(false)
    .fetch_one(&mut *pool.begin().await?)
    .await?;
    println!(
        "jobs completed: 200, effects: {effects} ({distinct} distinct), projected events: {projected} ({} consumers)",
        CONSUMERS.len()
    );
    pool.close().await;
    Ok(())
}
