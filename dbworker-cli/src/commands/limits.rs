//! `dbworker limit set|clear|list`: a queue's global limits (processing at
//! once, per key, started per second), kept in the limit table and enforced
//! by every worker's claim, as the library's `Limits` and the dashboard's
//! queues page set them.

use anyhow::{Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use dbworker::control::{DEFAULT_LIMIT_TABLE, Limit, Limits};

use crate::args::TableArgs;
use crate::commands::text::printable;
use crate::exit::usage;

#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    #[command(subcommand)]
    command: LimitCommand,
}

#[derive(Debug, Subcommand)]
enum LimitCommand {
    /// Replace a queue's limits with those given (the others are lifted).
    Set(SetArgs),
    /// Lift every limit of a queue.
    Clear(ClearArgs),
    /// The limits in force, by queue.
    List(ListArgs),
}

/// The table and its limit table, shared by the three.
#[derive(Debug, Args)]
struct LimitTable {
    #[command(flatten)]
    table: TableArgs,
    /// The limit table (`dbworker migration --limits` creates it).
    #[arg(long, default_value = DEFAULT_LIMIT_TABLE)]
    limit_table: String,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("limit").required(true).multiple(true)
    .args(["max_processing", "max_per_key", "rate"])))]
struct SetArgs {
    #[command(flatten)]
    limits: LimitTable,
    /// The queue, named exactly (a blank or padded name is refused).
    #[arg(long)]
    queue: String,
    /// At most this many jobs of the queue processing at once (0 stops it).
    #[arg(long)]
    max_processing: Option<u32>,
    /// At most this many processing at once per value of the key column
    /// (jobs whose value is NULL are not limited per key); needs the column
    /// the workers' table names (`limit_key_column`), checked here.
    #[arg(long, requires = "limit_key_column")]
    max_per_key: Option<u32>,
    /// With --max-per-key: the column whose value keys the limit.
    #[arg(long, requires = "max_per_key")]
    limit_key_column: Option<String>,
    /// At most this many jobs started per second, on average.
    #[arg(long)]
    rate: Option<f64>,
    /// With --rate: starts saved up while the queue is idle and spent at
    /// once (default: the rate rounded up).
    #[arg(long, requires = "rate")]
    burst: Option<u32>,
}

#[derive(Debug, Args)]
struct ClearArgs {
    #[command(flatten)]
    limits: LimitTable,
    /// The queue, named exactly (a blank or padded name is refused).
    #[arg(long)]
    queue: String,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    limits: LimitTable,
}

pub(crate) async fn limit(args: LimitArgs) -> Result<()> {
    match args.command {
        LimitCommand::Set(args) => set(args).await,
        LimitCommand::Clear(args) => clear(args).await,
        LimitCommand::List(args) => list(args).await,
    }
}

/// Refuses a queue name a limit cannot mean, before connecting: a blank one
/// (never the whole table) or one with whitespace at an end (a typo: names
/// are taken exactly, as the library takes them).
fn check_queue(queue: &str) -> Result<()> {
    if queue.trim().is_empty() {
        return Err(usage("--queue: name the queue (limits are per queue)"));
    }
    if queue.trim() != queue {
        return Err(usage(format!(
            "--queue: {queue:?} has whitespace at an end; queue names are taken exactly"
        )));
    }
    Ok(())
}

impl LimitTable {
    /// The table's limits, with the grants `write` needs checked too.
    async fn open(&self, key_column: Option<&str>, write: bool) -> Result<Limits> {
        let pool = self.table.target.connect().await?;
        let table = self
            .table
            .job_table_with(&pool, |o| {
                // Limits are per queue: the standard column unless named.
                o.queue_column.get_or_insert_with(|| "queue".to_owned());
                o.limit_table = Some(self.limit_table.clone());
                o.limit_key_column = key_column.map(str::to_owned);
            })
            .await
            .with_context(|| format!("limit table {}", self.limit_table))?;
        let limits = Limits::new(&pool, &table)
            .await
            .with_context(|| format!("limit table {}", self.limit_table))?;
        if write {
            limits.check_writes().await?;
        }
        Ok(limits)
    }
}

async fn set(args: SetArgs) -> Result<()> {
    check_queue(&args.queue)?;
    let mut limit = Limit::default();
    limit.max_processing = args.max_processing;
    limit.max_per_key = args.max_per_key;
    limit.rate_per_second = args.rate;
    limit.burst = args.burst;
    // The library's checks, named by the flags that set each value.
    match limit.validate() {
        Ok(()) => {}
        Err(dbworker::Error::InvalidOption { field, reason, .. }) => {
            let flag = match field {
                "rate_per_second" => "rate",
                other => other,
            };
            return Err(usage(format!("--{}: {reason}", flag.replace('_', "-"))));
        }
        Err(other) => return Err(other).context(format!("limit of queue {}", args.queue)),
    }
    let limits = args
        .limits
        .open(args.limit_key_column.as_deref(), true)
        .await?;
    limits
        .set_limit(&args.queue, limit)
        .await
        .with_context(|| format!("limiting queue {}", args.queue))?;
    println!("queue {}: {}", printable(&args.queue), describe(&limit));
    Ok(())
}

async fn clear(args: ClearArgs) -> Result<()> {
    check_queue(&args.queue)?;
    let limits = args.limits.open(None, true).await?;
    let had = limits
        .remove(&args.queue)
        .await
        .with_context(|| format!("lifting the limits of queue {}", args.queue))?;
    let queue = printable(&args.queue);
    if had {
        println!("queue {queue}: no limit");
    } else {
        println!("queue {queue} had no limit");
    }
    Ok(())
}

async fn list(args: ListArgs) -> Result<()> {
    let limits = args.limits.open(None, false).await?;
    let all = limits.list().await.context("reading the limits")?;
    if all.is_empty() {
        println!(
            "no queue of {} is limited",
            printable(&args.limits.table.target.table)
        );
        return Ok(());
    }
    println!("{:<32} LIMIT", "QUEUE");
    for (queue, limit) in &all {
        println!("{:<32} {}", printable(queue), describe(limit));
    }
    Ok(())
}

/// A limit as text, as the dashboard writes it: `at most 3 processing, 1
/// per key, 10/s (burst 20)`.
fn describe(l: &Limit) -> String {
    let mut parts = Vec::new();
    if let Some(m) = l.max_processing {
        parts.push(format!("at most {m} processing"));
    }
    if let Some(m) = l.max_per_key {
        parts.push(format!("{m} per key"));
    }
    match (l.rate_per_second, l.burst) {
        (Some(r), Some(b)) => parts.push(format!("{r}/s (burst {b})")),
        (Some(r), None) => parts.push(format!("{r}/s")),
        _ => {}
    }
    if parts.is_empty() {
        "no limit".to_owned()
    } else {
        parts.join(", ")
    }
}
