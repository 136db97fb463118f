//! `dbworker`: operate a job table — run the resetter or the purger as their
//! own processes, print DDL, look at jobs (`status`, `list`, `show`, `top`)
//! and act on them (`requeue`, `cancel`, `fail`, `delete`, `pause`, `resume`).

mod jobs;
mod top;
#[cfg(feature = "dashboard")]
mod ui;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dbworker::{
    Resetter,
    admin::Admin,
    cluster::{
        DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, LeaderElection, LeaderOptions, Node, NodeOptions,
        current_leader, live_nodes,
    },
    consumers::{
        DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE, consumer_assignments, consumer_lag,
    },
    control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, Pauses},
    cron::DEFAULT_CRON_TABLE,
    ddl::{
        OptionalColumns, consumer_tables_sql, cron_table_sql, enqueue_function_sql, job_table_sql,
        leader_table_sql, limit_table_sql, node_table_sql, notify_trigger_sql,
        optional_columns_sql, pause_table_sql,
    },
    maintenance::{PurgeOptions, Purger, ResetterOptions},
};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use workerutil::JobState;

#[derive(Debug, Parser)]
#[command(name = "dbworker", version, about = "Operate dbworker job tables")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Requeue (or fail) stalled processing jobs, every interval, until stopped.
    Reset(ResetArgs),
    /// Print the CREATE TABLE and indexes for a new job table.
    Migration(MigrationArgs),
    /// Delete (or archive) finished jobs older than their state's age.
    Purge(PurgeArgs),
    /// Live jobs per state and queue, the oldest wait, who is processing, and
    /// (with the registry) the live processes and the leader.
    Status(StatusArgs),
    /// Jobs matching a filter, a page at a time (by id).
    List(jobs::ListArgs),
    /// One job's row, every column, as pretty JSON.
    Show(JobArgs),
    /// Put failed, canceled or errored jobs back in the queue (one, or every
    /// job matching the filter).
    Requeue(jobs::ActionArgs),
    /// Cancel jobs: waiting ones now, processing ones through their worker.
    Cancel(jobs::ActionArgs),
    /// Fail waiting jobs.
    Fail(jobs::ActionArgs),
    /// Delete jobs that no worker holds.
    Delete(jobs::ActionArgs),
    /// A live view of queues, throughput and the hosts working (q quits).
    Top(top::TopArgs),
    /// Serve the web dashboard.
    #[cfg(feature = "dashboard")]
    Ui(ui::UiArgs),
    /// Pause the table, or one queue, for every worker that honours pauses.
    Pause(PauseArgs),
    /// Resume the table, or one queue, and wake listening workers.
    Resume(PauseArgs),
}

/// The database and the job table, as every command that connects takes them.
#[derive(Debug, Args)]
struct Target {
    /// The database to connect to.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The job table, optionally schema-qualified.
    #[arg(long, env = "DBWORKER_TABLE")]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
}

impl Target {
    fn renames(&self) -> HashMap<String, String> {
        self.renames.iter().cloned().collect()
    }

    /// One connection (an operator's command needs no more).
    async fn connect(&self) -> Result<sqlx::PgPool, String> {
        PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.database_url)
            .await
            .map_err(|e| format!("cannot connect: {e}"))
    }
}

/// The job table for the operator commands.
#[derive(Debug, Args)]
struct TableArgs {
    #[command(flatten)]
    target: Target,
    /// The queue column, if the table has one.
    #[arg(long, env = "DBWORKER_QUEUE_COLUMN")]
    queue_column: Option<String>,
    /// The kind column, if the table has one.
    #[arg(long, env = "DBWORKER_KIND_COLUMN")]
    kind_column: Option<String>,
}

impl TableArgs {
    async fn admin(&self) -> Result<Admin, String> {
        self.admin_on(&self.target.connect().await?).await
    }

    /// The admin on a connection the command already has.
    async fn admin_on(&self, pool: &sqlx::PgPool) -> Result<Admin, String> {
        let t = &self.target;
        let admin = Admin::new(pool, &t.table, &t.renames(), self.queue_column.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        match &self.kind_column {
            Some(kind) => admin.with_kind_column(kind).map_err(|e| e.to_string()),
            None => Ok(admin),
        }
    }
}

#[derive(Debug, Args)]
struct JobArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The job's id.
    id: i64,
}

#[derive(Debug, Args)]
struct PauseArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Only this queue (default: the whole table).
    #[arg(long)]
    queue: Option<String>,
    /// The pause table.
    #[arg(long, default_value = DEFAULT_PAUSE_TABLE)]
    pause_table: String,
    /// Who pauses, recorded with the pause.
    #[arg(long, default_value = "dbworker cli")]
    by: String,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    consumers: ConsumerArgs,
}

/// The worker registry, for the commands that use it.
#[derive(Debug, Args)]
struct RegistryArgs {
    /// The worker registry table (`dbworker migration --nodes`).
    #[arg(long, env = "DBWORKER_NODE_TABLE")]
    node_table: Option<String>,
    /// A process whose registry heartbeat is older than this is dead.
    #[arg(long, env = "DBWORKER_DEAD_AFTER_SECS", default_value_t = 10.0)]
    dead_after_secs: f64,
    /// The leader lease table (with --node-table).
    #[arg(long, default_value = DEFAULT_LEADER_TABLE)]
    leader_table: String,
}

/// Log consumers, for `status`.
#[derive(Debug, Args)]
struct ConsumerArgs {
    /// The events table of log consumers: print each consumer's lag.
    #[arg(long, env = "DBWORKER_EVENTS_TABLE")]
    events_table: Option<String>,
    /// The events table's position column.
    #[arg(long, default_value = "global_position")]
    position_column: String,
    /// The consumers' checkpoint table.
    #[arg(long, default_value = DEFAULT_CHECKPOINT_TABLE)]
    checkpoint_table: String,
    /// The consumers' assignment table.
    #[arg(long, default_value = DEFAULT_ASSIGNMENT_TABLE)]
    assignment_table: String,
}

async fn status(args: StatusArgs) -> Result<(), String> {
    // One connection for every section.
    let pool = args.table.target.connect().await?;
    let admin = args.table.admin_on(&pool).await?;
    let status = admin.status().await.map_err(|e| e.to_string())?;
    println!("{:<12} {:<16} {:>10}", "state", "queue", "jobs");
    for (state, queue, count) in &status.live {
        println!(
            "{:<12} {:<16} {count:>10}",
            state.as_str(),
            queue.as_deref().unwrap_or("-")
        );
    }
    println!("oldest waiting: {:.1} s", status.oldest_waiting_seconds);
    for (host, count) in &status.processing_by_host {
        println!("processing on {host}: {count}");
    }
    println!("rows in the table (estimate): {}", status.estimated_rows);
    if let Some(node_table) = &args.registry.node_table {
        process_status(&pool, &args.registry, node_table, &args.table.target.table).await?;
    }
    if let Some(events) = &args.consumers.events_table {
        consumer_status(&pool, &args.consumers, events).await?;
    }
    Ok(())
}

/// The live processes of the registry, the table's leader marked.
async fn process_status(
    pool: &sqlx::PgPool,
    r: &RegistryArgs,
    node_table: &str,
    table: &str,
) -> Result<(), String> {
    let dead_after = seconds("dead-after-secs", r.dead_after_secs)?;
    let nodes = live_nodes(pool, node_table, dead_after)
        .await
        .map_err(|e| e.to_string())?;
    let leader = current_leader(pool, &r.leader_table, table)
        .await
        .map_err(|e| e.to_string())?;
    println!("live processes: {}", nodes.len());
    for n in &nodes {
        let lead = if leader.as_deref() == Some(n.id.as_str()) {
            " (leader)"
        } else {
            ""
        };
        println!(
            "  {}{lead}  pid {}  v{}  handlers {}  queues [{}]  up {}  heartbeat {:.1} s ago",
            n.id,
            n.pid,
            n.version,
            n.handlers,
            n.queues.join(", "),
            dbworker::admin::format_age(n.up_seconds),
            n.heartbeat_age_seconds
        );
    }
    match leader {
        Some(l) if !nodes.iter().any(|n| n.id == l) => {
            println!("leader: {l} (not in the registry)")
        }
        None => println!("leader: none"),
        _ => {}
    }
    Ok(())
}

/// Each consumer's checkpoint, lag and process.
async fn consumer_status(
    pool: &sqlx::PgPool,
    c: &ConsumerArgs,
    events: &str,
) -> Result<(), String> {
    let err = |e: dbworker::Error| e.to_string();
    let lags = consumer_lag(pool, events, &c.position_column, &c.checkpoint_table)
        .await
        .map_err(err)?;
    let owners = consumer_assignments(pool, &c.assignment_table)
        .await
        .map_err(err)?;
    println!(
        "{:<24} {:>12} {:>12} {:>10}  process",
        "consumer", "checkpoint", "latest", "lag"
    );
    for l in &lags {
        let owner = owners
            .iter()
            .find(|(name, _)| *name == l.consumer)
            .map_or("-", |(_, node)| node.as_str());
        println!(
            "{:<24} {:>12} {:>12} {:>10}  {owner}",
            l.consumer,
            l.last_position,
            l.latest,
            l.lag()
        );
    }
    Ok(())
}

async fn show(args: JobArgs) -> Result<(), String> {
    let admin = args.table.admin().await?;
    match admin.show(args.id).await.map_err(|e| e.to_string())? {
        Some(row) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&row).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        None => Err(format!("no job {}", args.id)),
    }
}

async fn pause(args: PauseArgs, resume: bool) -> Result<(), String> {
    let t = &args.table.target;
    let pool = t.connect().await?;
    let pauses = Pauses::new(&pool, &args.pause_table, &t.table)
        .await
        .map_err(|e| e.to_string())?;
    let what = args
        .queue
        .as_deref()
        .map_or_else(|| format!("table {}", t.table), |q| format!("queue {q}"));
    let changed = if resume {
        pauses.resume(args.queue.as_deref()).await
    } else {
        pauses.pause(args.queue.as_deref(), &args.by).await
    }
    .map_err(|e| e.to_string())?;
    let verb = if resume { "resumed" } else { "paused" };
    if changed {
        println!("{verb} {what}");
    } else {
        println!("{what} was already {verb}");
    }
    Ok(())
}

#[derive(Debug, Args)]
struct PurgeArgs {
    #[command(flatten)]
    target: Target,
    /// Purge completed jobs this many seconds after they finished. With none of
    /// the three ages given: completed after 7 days, failed and canceled after 30.
    #[arg(long)]
    completed_after_secs: Option<f64>,
    /// Purge failed jobs this many seconds after they finished.
    #[arg(long)]
    failed_after_secs: Option<f64>,
    /// Purge canceled jobs this many seconds after they finished.
    #[arg(long)]
    canceled_after_secs: Option<f64>,
    /// Rows per statement (each batch is a short transaction).
    #[arg(long, default_value_t = 1000)]
    batch_size: u32,
    /// Move rows to this table (same columns as the job table) instead of deleting.
    #[arg(long)]
    archive_table: Option<String>,
    /// Seconds between passes.
    #[arg(long, default_value_t = 60.0)]
    interval_secs: f64,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
}

async fn purge(args: PurgeArgs) -> Result<(), String> {
    let mut options = PurgeOptions::new(&args.target.table);
    options.alternate_column_names = args.target.renames();
    let ages = [
        (
            JobState::Completed,
            args.completed_after_secs,
            "completed-after-secs",
        ),
        (
            JobState::Failed,
            args.failed_after_secs,
            "failed-after-secs",
        ),
        (
            JobState::Canceled,
            args.canceled_after_secs,
            "canceled-after-secs",
        ),
    ];
    if ages.iter().any(|(_, age, _)| age.is_some()) {
        options.max_age = Vec::new();
        for (state, age, flag) in ages {
            if let Some(secs) = age {
                options.max_age.push((state, seconds(flag, secs)?));
            }
        }
    }
    options.batch_size = args.batch_size;
    options.archive_table = args.archive_table;
    options.interval = seconds("interval-secs", args.interval_secs)?;
    options.validate().map_err(|e| e.to_string())?;
    let pool = args.target.connect().await?;
    let purger = Purger::new(pool, options)
        .await
        .map_err(|e| e.to_string())?;
    if args.once {
        let purged = purger.purge_once().await.map_err(|e| e.to_string())?;
        for (state, n) in &purged.by_state {
            println!("purged {n} {} job(s)", state.as_str());
        }
        return Ok(());
    }
    tracing::info!(table = %args.target.table, "purger running; stop with SIGINT or SIGTERM");
    purger.run(stop_on_signal()).await;
    Ok(())
}

#[derive(Debug, Args)]
struct ResetArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds without a heartbeat after which an unlocked processing job is stalled.
    #[arg(long, env = "DBWORKER_STALLED_MAX_AGE_SECS", default_value_t = 30.0)]
    stalled_max_age_secs: f64,
    /// Resets allowed before a stalled job is failed.
    #[arg(long, env = "DBWORKER_MAX_NUM_RESETS", default_value_t = 3)]
    max_num_resets: u32,
    /// The failure message of jobs failed for too many resets.
    #[arg(long, default_value = dbworker::store::DEFAULT_RESET_FAILURE_MESSAGE)]
    reset_failure_message: String,
    /// Seconds between passes.
    #[arg(long, env = "DBWORKER_RESET_INTERVAL_SECS", default_value_t = 30.0)]
    interval_secs: f64,
    /// Seconds to wait for the database before reporting it unreachable.
    #[arg(long, env = "DBWORKER_CONNECT_TIMEOUT_SECS", default_value_t = 5.0)]
    connect_timeout_secs: f64,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Register in the worker registry and reset only while leading the
    /// table's scope, so several resetter processes can stand by for one
    /// another (needs --node-table).
    #[arg(long, requires = "node_table")]
    lead: bool,
    /// With --lead: the leader's lease; a standby takes over within 4/3 of it
    /// after the leader dies.
    #[arg(long, default_value_t = 6.0)]
    lease_secs: f64,
}

#[derive(Debug, Args)]
struct MigrationArgs {
    /// The new job table's name, optionally schema-qualified.
    #[arg(long)]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
    /// Also print the trigger that NOTIFYs listening workers when jobs are queued.
    #[arg(long)]
    notify: bool,
    /// The NOTIFY channel (default: `dbworker_<table>`, what `Listen::TableChannel` listens on).
    #[arg(long, requires = "notify")]
    channel: Option<String>,
    /// Also add a `job_key` column and its unique index (job keys).
    #[arg(long)]
    keys: bool,
    /// Also add a `queue` column.
    #[arg(long)]
    queue: bool,
    /// Also add a `priority` column and its dequeue index.
    #[arg(long)]
    priority: bool,
    /// Also add a `max_retries` column (per-job retry limits).
    #[arg(long)]
    max_retries: bool,
    /// Also add a `kind` column (many kinds of job in one table).
    #[arg(long)]
    kind: bool,
    /// Also create the pause table (`dbworker_pauses`), shared by every job table.
    #[arg(long)]
    pauses: bool,
    /// Also add the index the purger uses (`finished_at` over final states).
    #[arg(long)]
    retention: bool,
    /// Also create the limit table (`dbworker_limits`), shared by every job table.
    #[arg(long)]
    limits: bool,
    /// Also create the cron table (`dbworker_cron`), shared by every job table.
    #[arg(long)]
    cron: bool,
    /// Also create the worker registry (`dbworker_nodes`) and the leader lease
    /// table (`dbworker_leaders`), shared by every job table.
    #[arg(long)]
    nodes: bool,
    /// Also create the log consumers' assignment and checkpoint tables (with
    /// --nodes for the registry and leases they need).
    #[arg(long)]
    consumers: bool,
    /// Also print `<table>_enqueue(fields jsonb, run_at, ...)`, a SQL function
    /// for producers in other languages (with the optional columns chosen above).
    #[arg(long)]
    enqueue_function: bool,
}

fn migration(args: MigrationArgs) -> Result<(), String> {
    let renames = args.renames.into_iter().collect();
    let mut ddl = job_table_sql(&args.table, &renames).map_err(|e| e.to_string())?;
    let mut optional = OptionalColumns::default();
    optional.keys = args.keys;
    optional.queue = args.queue;
    optional.priority = args.priority;
    optional.max_retries = args.max_retries;
    optional.kind = args.kind;
    optional.retention = args.retention;
    if optional != OptionalColumns::default() {
        ddl.push('\n');
        ddl.push_str(
            &optional_columns_sql(&args.table, &renames, optional).map_err(|e| e.to_string())?,
        );
    }
    if args.cron {
        ddl.push('\n');
        ddl.push_str(&cron_table_sql(DEFAULT_CRON_TABLE).map_err(|e| e.to_string())?);
    }
    if args.nodes {
        ddl.push('\n');
        ddl.push_str(&node_table_sql(DEFAULT_NODE_TABLE).map_err(|e| e.to_string())?);
        ddl.push_str(&leader_table_sql(DEFAULT_LEADER_TABLE).map_err(|e| e.to_string())?);
    }
    if args.consumers {
        ddl.push('\n');
        ddl.push_str(
            &consumer_tables_sql(DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE)
                .map_err(|e| e.to_string())?,
        );
    }
    if args.limits {
        ddl.push('\n');
        ddl.push_str(&limit_table_sql(DEFAULT_LIMIT_TABLE).map_err(|e| e.to_string())?);
    }
    if args.pauses {
        ddl.push('\n');
        ddl.push_str(&pause_table_sql(DEFAULT_PAUSE_TABLE).map_err(|e| e.to_string())?);
    }
    if args.enqueue_function {
        ddl.push('\n');
        ddl.push_str(
            &enqueue_function_sql(&args.table, &renames, optional).map_err(|e| e.to_string())?,
        );
    }
    if args.notify {
        ddl.push('\n');
        ddl.push_str(
            &notify_trigger_sql(&args.table, &renames, args.channel.as_deref())
                .map_err(|e| e.to_string())?,
        );
    }
    print!("{ddl}");
    Ok(())
}

fn parse_rename(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!("expected standard=actual, got {s:?}")),
    }
}

pub(crate) fn seconds(flag: &str, secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|e| format!("--{flag}: {e}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Migration(args) => migration(args),
        Command::Purge(args) => purge(args).await,
        Command::Status(args) => status(args).await,
        Command::List(args) => jobs::list(args).await,
        Command::Show(args) => show(args).await,
        Command::Requeue(args) => jobs::act("requeue", args).await,
        Command::Cancel(args) => jobs::act("cancel", args).await,
        Command::Delete(args) => jobs::act("delete", args).await,
        Command::Fail(args) => jobs::act("fail", args).await,
        Command::Top(args) => top::top(args).await,
        #[cfg(feature = "dashboard")]
        Command::Ui(args) => ui::serve(args).await,
        Command::Pause(args) => pause(args, false).await,
        Command::Resume(args) => pause(args, true).await,
        Command::Reset(args) => reset(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("dbworker: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn reset(args: ResetArgs) -> Result<(), String> {
    let mut options = ResetterOptions::new("dbworker_resetter", &args.target.table);
    options.alternate_column_names = args.target.renames();
    options.stalled_max_age = seconds("stalled-max-age-secs", args.stalled_max_age_secs)?;
    options.max_num_resets = args.max_num_resets;
    options.reset_failure_message = args.reset_failure_message;
    options.interval = seconds("interval-secs", args.interval_secs)?;
    options.connect_timeout = seconds("connect-timeout-secs", args.connect_timeout_secs)?;
    options.node_table = args.registry.node_table.clone();
    options.dead_after = seconds("dead-after-secs", args.registry.dead_after_secs)?;
    options.validate().map_err(|e| e.to_string())?;
    // Lazy: `check` below connects with the timeout and reports the real cause.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(options.connect_timeout)
        .connect_lazy(&args.target.database_url)
        .map_err(|e| format!("invalid DATABASE_URL: {e}"))?;
    let resetter = Resetter::new(pool.clone(), options).map_err(|e| e.to_string())?;
    resetter.check().await.map_err(|e| e.to_string())?;
    if args.once {
        let out = resetter.reset_once().await.map_err(|e| e.to_string())?;
        println!(
            "reset {} job(s), failed {} job(s)",
            out.reset.len(),
            out.failed.len()
        );
        for (id, age) in &out.reset {
            println!("reset {id} (heartbeat {:.1}s old)", age.as_secs_f64());
        }
        for id in &out.failed {
            println!("failed {id}");
        }
        return Ok(());
    }
    tracing::info!(table = %args.target.table, "resetter running; stop with SIGINT or SIGTERM");
    let report = |out: &dbworker::maintenance::ResetOutcome| {
        if !out.reset.is_empty() || !out.failed.is_empty() {
            tracing::info!(
                reset = out.reset.len(),
                failed = out.failed.len(),
                "reset pass"
            );
        }
    };
    let stop = stop_on_signal();
    match (&args.registry.node_table, args.lead) {
        (Some(node_table), true) => {
            let mut no = NodeOptions::default();
            no.node_table = node_table.clone();
            let node = Node::register(&pool, no).await.map_err(|e| e.to_string())?;
            let mut lo = LeaderOptions::new(args.target.table.clone());
            lo.leader_table = args.registry.leader_table.clone();
            lo.lease = seconds("lease-secs", args.lease_secs)?;
            let election = LeaderElection::new(&pool, node.id(), lo)
                .await
                .map_err(|e| e.to_string())?;
            let heartbeats = tokio::spawn(node.run(stop.clone()));
            let resetter = std::sync::Arc::new(resetter);
            election
                .run(stop, move |leading| {
                    let resetter = resetter.clone();
                    async move { resetter.run(leading, report).await }
                })
                .await;
            heartbeats.await.map_err(|e| e.to_string())?;
        }
        _ => resetter.run(stop, report).await,
    }
    Ok(())
}

/// A token canceled by SIGINT or SIGTERM.
pub(crate) fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        on_signal.cancel();
    });
    stop
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
