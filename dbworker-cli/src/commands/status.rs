//! `dbworker status`: live jobs per state and queue, the oldest wait, who is
//! processing, and (optionally) the registry's processes and the consumers' lag.

use anyhow::{Context, Result};
use clap::Args;
use dbworker::{
    cluster::{current_leader, live_nodes},
    consumers::{
        DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE, consumer_assignments, consumer_lag,
    },
};

use crate::args::{RegistryArgs, TableArgs, seconds};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    consumers: ConsumerArgs,
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
    let pool = args.table.target.connect().await?;
    let admin = args.table.admin_on(&pool).await?;
    let status = admin
        .status()
        .await
        .with_context(|| format!("status of {}", args.table.target.table))?;
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
) -> Result<()> {
    let dead_after = seconds("dead-after-secs", r.dead_after_secs)?;
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
            "{:<24} {:>12} {:>12} {:>10}  {owner}",
            l.consumer,
            l.last_position,
            l.latest,
            l.lag()
        );
    }
    Ok(())
}
