//! `dbworker status`: every state per queue and in total, paused queues, the
//! oldest wait, who is processing, and (optionally) the registry's processes
//! and the consumers' lag; as text or JSON.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::{
    admin::{FinishedCounts, QueueCounts, STATE_COLUMNS, Status},
    cluster::{current_leader, live_nodes},
    consumers::{
        DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE, consumer_assignments, consumer_lag,
    },
    control::{Pause, Pauses, PausesOptions},
    history::DEFAULT_HISTORY_TABLE,
};

use crate::args::{Format, FormatArg, ReadArgs, RegistryArgs, TableArgs, duration, human};
use crate::commands::json::{self, print_json};
// Every name below (queues, hosts, processes, consumers, who paused) was
// chosen by another program or operator: printed with control characters
// as spaces.
use crate::commands::text::printable;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    read: ReadArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    consumers: ConsumerArgs,
    /// A processing job whose heartbeat is older than this counts as
    /// stalled (the resetter's `--stalled-max-age`).
    #[arg(long, default_value = "30s", value_parser = duration)]
    stalled_after: Duration,
    /// The history table (`dbworker history`): without an index over the
    /// final states, their counts come from it, over the period it keeps,
    /// rather than from the planner's estimate (used when it exists).
    #[arg(long, default_value = DEFAULT_HISTORY_TABLE)]
    history_table: String,
    /// The pause table, to show paused queues (default: dbworker_pauses,
    /// when it exists).
    #[arg(long)]
    pause_table: Option<String>,
    #[command(flatten)]
    format: FormatArg,
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

pub(crate) async fn status(args: StatusArgs) -> Result<()> {
    // One connection for every section.
    let (pool, admin) = args.table.reader(&args.read).await?;
    let table = &args.table.target.table;
    let status = admin
        .status_with_history(args.stalled_after, &args.history_table)
        .await
        .with_context(|| format!("status of {table}"))?;
    let paused = paused(&pool, &args).await?;
    if args.format.format == Format::Json {
        return print_json(&json::status(table, &status, paused.as_deref()));
    }
    if args.read.replica_url.is_some() {
        let lag = dbworker::admin::replica_lag(&pool)
            .await
            .context("the replica's lag")?;
        println!("read from a replica: {}", lag.describe());
    }
    print_counts(&status);
    if let Some(paused) = &paused {
        if paused.is_empty() {
            println!("paused: none");
        }
        for p in paused {
            let what = p.queue.as_deref().map_or_else(
                || "the whole table".to_owned(),
                |q| format!("queue {}", printable(q)),
            );
            println!(
                "paused: {what}, by {} for {}",
                printable(&p.paused_by),
                human(Duration::from_secs_f64(p.seconds.max(0.0)))
            );
        }
    }
    println!(
        "oldest waiting: {}",
        human(Duration::from_secs_f64(
            status.oldest_waiting_seconds.max(0.0)
        ))
    );
    for (host, count) in &status.processing_by_host {
        println!("processing on {}: {count}", printable(host));
    }
    println!("rows in the table (estimate): {}", status.estimated_rows);
    if let Some(node_table) = &args.registry.node_table {
        process_status(&pool, &args.registry, node_table, table).await?;
    }
    if let Some(events) = &args.consumers.events_table {
        consumer_status(&pool, &args.consumers, events).await?;
    }
    Ok(())
}

/// The table's pauses: from `--pause-table`, or from the pause table the job
/// table honours (the standard one, when it exists); `None` when there is
/// none. A pause table that cannot be read is an error naming why (a
/// missing grant with its `GRANT`), never a silently missing line.
async fn paused(pool: &sqlx::PgPool, args: &StatusArgs) -> Result<Option<Vec<Pause>>> {
    let table = args
        .table
        .job_table_with(pool, |o| o.pause_table = args.pause_table.clone())
        .await?;
    let Some(name) = table.pause_table() else {
        return Ok(None);
    };
    let pauses = Pauses::new(pool, &table, PausesOptions::default())
        .await
        .with_context(|| format!("pause table {name}"))?;
    let list = pauses
        .list()
        .await
        .with_context(|| format!("pause table {name}"))?;
    Ok(Some(list))
}

/// Every state per queue, then the totals.
fn print_counts(s: &Status) {
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    // Each column as wide as its heading (at least 8), right-aligned.
    let widths = STATE_COLUMNS.map(|h| h.len().max(8));
    let line = |name: &str, cells: [String; 10]| {
        let cells: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        println!("{name:<16} {}", cells.join(" "));
    };
    line("queue", STATE_COLUMNS.map(str::to_owned));
    let row = |name: &str, q: &QueueCounts| line(name, q.in_columns().map(n));
    for q in &s.queues {
        row(&printable(q.queue.as_deref().unwrap_or("-")), q);
    }
    row("total", &s.total);
    println!(
        "stalled: processing with no heartbeat for {}; available: due now (errored ones included)",
        human(s.stalled_age)
    );
    if let FinishedCounts::FromHistory { covered } = s.finished {
        println!(
            "completed, failed, canceled: finished in the last {}, from the history (no index over the final states; `dbworker migration --retention` adds one)",
            dbworker::admin::format_age(covered.as_secs_f64())
        );
    } else if s.finished != FinishedCounts::Exact {
        println!(
            "completed, failed, canceled: planner estimates, in total only (no index over the final states; `dbworker migration --retention` adds one)"
        );
    }
}

/// The live processes of the registry, the table's leader marked.
async fn process_status(
    pool: &sqlx::PgPool,
    r: &RegistryArgs,
    node_table: &str,
    table: &str,
) -> Result<()> {
    let dead_after = r.dead_after;
    let nodes = live_nodes(pool, node_table, dead_after)
        .await
        .with_context(|| format!("live processes in {node_table}"))?;
    let leader = current_leader(pool, &r.leader_table, table)
        .await
        .with_context(|| format!("leader of {table} in {}", r.leader_table))?;
    println!("live processes: {}", nodes.len());
    for n in &nodes {
        let lead = if leader.as_deref() == Some(n.id.as_str()) {
            " (leader)"
        } else {
            ""
        };
        let honours = match &n.honours {
            Some(h) if h.is_empty() => "no pause or limit table".to_owned(),
            Some(h) => printable(&h.join(", ")),
            // A process of a version before the registry recorded it.
            None => "unknown (it may ignore pauses and limits)".to_owned(),
        };
        println!(
            "  {}{lead}  pid {}  v{}  handlers {}  queues [{}]  up {}  heartbeat {:.1} s ago  honours: {honours}",
            printable(&n.id),
            n.pid,
            printable(&n.version),
            n.handlers,
            printable(&n.queues.join(", ")),
            dbworker::admin::format_age(n.up_seconds),
            n.heartbeat_age_seconds
        );
    }
    match leader {
        Some(l) if !nodes.iter().any(|n| n.id == l) => {
            println!("leader: {} (not in the registry)", printable(&l))
        }
        None => println!("leader: none"),
        _ => {}
    }
    Ok(())
}

/// Each consumer's checkpoint, lag and process.
async fn consumer_status(pool: &sqlx::PgPool, c: &ConsumerArgs, events: &str) -> Result<()> {
    let lags = consumer_lag(pool, events, &c.position_column, &c.checkpoint_table)
        .await
        .with_context(|| format!("consumer lag on {events}"))?;
    let owners = consumer_assignments(pool, &c.assignment_table)
        .await
        .with_context(|| format!("consumer assignments in {}", c.assignment_table))?;
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
            "{:<24} {:>12} {:>12} {:>10}  {}",
            printable(&l.consumer),
            l.last_position,
            l.latest,
            l.lag(),
            printable(owner)
        );
    }
    Ok(())
}
