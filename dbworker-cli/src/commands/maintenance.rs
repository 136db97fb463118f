//! The long-running upkeep of a job table, each as its own process or one
//! pass with `--once`: `dbworker purge` (retention) and `dbworker reset` (the
//! resetter, optionally leading among standbys).

use dbworker::Service;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::{
    Resetter, ResetterOptions,
    cluster::{LeaderElection, LeaderOptions, Node, NodeOptions},
    history::{DEFAULT_HISTORY_TABLE, HistoryOptions},
    maintenance::{PurgeOptions, Purger},
};
use workerutil::JobState;

use crate::args::{RegistryArgs, Target, duration};
use crate::commands::text::printable;
use crate::signal::stop_on_signal;

#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    target: Target,
    /// Purge completed jobs this many seconds after they finished. With none of
    /// the three ages given: completed after 7 days, failed and canceled after 30.
    #[arg(long, value_parser = duration, alias = "completed-after-secs")]
    completed_after: Option<Duration>,
    /// Purge failed jobs this many seconds after they finished.
    #[arg(long, value_parser = duration, alias = "failed-after-secs")]
    failed_after: Option<Duration>,
    /// Purge canceled jobs this many seconds after they finished.
    #[arg(long, value_parser = duration, alias = "canceled-after-secs")]
    canceled_after: Option<Duration>,
    /// Rows per statement (each batch is a short transaction).
    #[arg(long, default_value_t = 1000)]
    chunk_size: u32,
    /// Move rows to this table (same columns as the job table) instead of deleting.
    #[arg(long)]
    archive_table: Option<String>,
    /// Seconds between passes.
    #[arg(long, default_value = "60s", value_parser = duration, alias = "interval-secs")]
    interval: Duration,
    /// Keep each finished job until the job history (`dbworker history`)
    /// has recorded its minute, so a short age takes no job from the
    /// dashboard's charts; a job older than --history-catch-up goes at its
    /// age (the history never records it). Needs SELECT on the history table.
    #[arg(long)]
    history: bool,
    /// With --history: the history table (`dbworker migration --history`).
    #[arg(long, requires = "history", default_value = DEFAULT_HISTORY_TABLE)]
    history_table: String,
    /// With --history: how far back the history catches up (its
    /// `HistoryOptions::catch_up`; `dbworker history` uses 6 hours). Give the
    /// value an application's own history runs with.
    #[arg(long, requires = "history", default_value = "6h", value_parser = duration)]
    history_catch_up: Duration,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
}

pub(crate) async fn purge(args: PurgeArgs) -> Result<()> {
    let mut options = PurgeOptions::new();
    let ages = [
        (JobState::Completed, args.completed_after),
        (JobState::Failed, args.failed_after),
        (JobState::Canceled, args.canceled_after),
    ];
    if ages.iter().any(|(_, age)| age.is_some()) {
        options.max_age = ages
            .into_iter()
            .filter_map(|(state, age)| Some((state, age?)))
            .collect();
    }
    options.chunk_size = args.chunk_size;
    options.archive_table = args.archive_table;
    options.interval = args.interval;
    if args.history {
        let mut history = HistoryOptions::default();
        history.history_table = args.history_table;
        history.catch_up = args.history_catch_up;
        // The purger reads only the table and catch_up; the history's own
        // bound on downsampling (checked with them) follows catch_up.
        history.downsample_after = history
            .downsample_after
            .max(history.catch_up + history.settle + Duration::from_secs(3600));
        options.history = Some(history);
    }
    options.validate()?;
    let pool = args.target.connect().await?;
    let table = args.target.job_table(&pool).await?;
    let purger = Purger::new(&pool, &table, options)
        .await
        .with_context(|| format!("purger for {}", args.target.table))?;
    if args.once {
        let purged = purger
            .purge_once()
            .await
            .with_context(|| format!("purging {}", args.target.table))?;
        // Partition names are the table's name, which a flag gave.
        for name in &purged.partitions_created {
            println!("created partition {}", printable(name));
        }
        for p in &purged.partitions_dropped {
            println!(
                "dropped partition {} ({} job(s))",
                printable(&p.name),
                p.rows
            );
        }
        for (state, n) in &purged.by_state {
            println!("purged {n} {} job(s)", state.as_str());
        }
        if purged.orphans > 0 {
            println!(
                "deleted {} side row(s) of jobs that no longer exist",
                purged.orphans
            );
        }
        return Ok(());
    }
    tracing::info!(table = %args.target.table, "purger running; stop with SIGINT or SIGTERM");
    purger.run(stop_on_signal()).await?;
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct ResetArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds without a heartbeat after which an unlocked processing job is stalled.
    #[arg(long, env = "DBWORKER_STALLED_MAX_AGE", default_value = "30s", value_parser = duration, alias = "stalled-max-age-secs")]
    stalled_max_age: Duration,
    /// Resets allowed before a stalled job is failed.
    #[arg(long, env = "DBWORKER_MAX_NUM_RESETS", default_value_t = 3)]
    max_num_resets: u32,
    /// The failure message of jobs failed for too many resets.
    #[arg(long, default_value = dbworker::DEFAULT_RESET_FAILURE_MESSAGE)]
    reset_failure_message: String,
    /// Seconds between passes.
    #[arg(long, env = "DBWORKER_RESET_INTERVAL", default_value = "30s", value_parser = duration, alias = "interval-secs")]
    interval: Duration,
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
    #[arg(long, default_value = "6s", value_parser = duration, alias = "lease-secs")]
    lease: Duration,
    /// The table's error history column (`dbworker migration --error-history`
    /// adds `errors`): each reset appends an entry to it.
    #[arg(long)]
    error_history_column: Option<String>,
    /// With --error-history-column: the most entries a job keeps.
    #[arg(long, default_value_t = dbworker::DEFAULT_ERROR_HISTORY_LIMIT)]
    error_history_limit: u32,
    /// With --node-table: a process whose registry heartbeat is this old has
    /// its jobs whose own heartbeat is as old requeued. Keep it above the
    /// workers' heartbeat_failure_limit (15 s by default) plus three of their
    /// heartbeat intervals (1 s by default), or a process cut off from the
    /// database for less runs a job beside its requeued copy.
    #[arg(long, env = "DBWORKER_RESCUE_AFTER", default_value = "18s", value_parser = duration)]
    rescue_after: Duration,
}

pub(crate) async fn reset(args: ResetArgs) -> Result<()> {
    let mut options = ResetterOptions::new("dbworker_resetter");
    options.stall.stalled_max_age = args.stalled_max_age;
    options.stall.max_num_resets = args.max_num_resets;
    options.stall.reset_failure_message = args.reset_failure_message;
    options.interval = args.interval;
    options.node_table = args.registry.node_table.clone();
    options.dead_after = args.rescue_after;
    options.validate()?;
    let pool = args.target.database.connect(2).await?;
    let table = args
        .target
        .job_table_with(&pool, |o| {
            o.error_history_column = args.error_history_column.clone();
            o.error_history_limit = args.error_history_limit;
        })
        .await?;
    let resetter = Resetter::new(&pool, &table, options).await?;
    if args.once {
        let out = resetter
            .reset_once()
            .await
            .with_context(|| format!("resetting stalled jobs of {}", args.target.table))?;
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
    // Each pass that did something, logged as it ends.
    let mut passes = resetter.subscribe();
    tokio::spawn(async move {
        while let Ok(out) = passes.recv().await {
            if !out.reset.is_empty() || !out.failed.is_empty() {
                tracing::info!(
                    reset = out.reset.len(),
                    failed = out.failed.len(),
                    "reset pass"
                );
            }
        }
    });
    let stop = stop_on_signal();
    match (&args.registry.node_table, args.lead) {
        (Some(node_table), true) => {
            let mut no = NodeOptions::default();
            no.node_table = node_table.clone();
            let node = Node::new(&pool, no)
                .await
                .with_context(|| format!("registering in {node_table}"))?;
            let mut lo = LeaderOptions::new(args.target.table.clone(), node.id());
            lo.leader_table = args.registry.leader_table.clone();
            lo.lease = args.lease;
            let election = LeaderElection::new(&pool, lo)
                .await
                .with_context(|| format!("leader election in {}", args.registry.leader_table))?;
            let heartbeats = tokio::spawn(node.run(stop.clone()));
            let resetter = Arc::new(resetter);
            election
                .run(stop, move |leading| {
                    let resetter = resetter.clone();
                    async move {
                        if let Err(err) = resetter.run_as_leader(leading).await {
                            tracing::error!(error = %err, "the resetter stopped");
                        }
                    }
                })
                .await;
            heartbeats.await.context("the registry heartbeats")?;
        }
        _ => resetter.run(stop).await?,
    }
    Ok(())
}
