//! `dbworker pause` and `dbworker resume`: durable pauses of the table or of
//! one queue, for every worker that honours pauses.

use anyhow::{Context, Result};
use clap::Args;
use dbworker::control::{DEFAULT_PAUSE_TABLE, Pauses, PausesOptions};

use crate::args::TableArgs;
use crate::commands::text::printable;

#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
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

/// Pauses (or, with `resume`, resumes) the table or the queue.
pub(crate) async fn pause(args: PauseArgs, resume: bool) -> Result<()> {
    // An empty --queue must not mean the whole table (leaving it out does).
    if args.queue.as_deref().is_some_and(|q| q.trim().is_empty()) {
        return Err(crate::exit::usage(
            "--queue: name the queue, or leave --queue out for the whole table",
        ));
    }
    let t = &args.table.target;
    let pool = t.connect().await?;
    let table = args
        .table
        .job_table_with(&pool, |o| o.pause_table = Some(args.pause_table.clone()))
        .await?;
    let pauses = Pauses::new(&pool, &table, PausesOptions::default())
        .await
        .with_context(|| format!("pause table {}", args.pause_table))?;
    pauses.check_writes().await?;
    // Echoed names are printed as the other commands print names.
    let what = args.queue.as_deref().map_or_else(
        || format!("table {}", printable(&t.table)),
        |q| format!("queue {}", printable(q)),
    );
    let changed = if resume {
        pauses.resume(args.queue.as_deref()).await
    } else {
        pauses.pause(args.queue.as_deref(), &args.by).await
    }
    .with_context(|| format!("{} {what}", if resume { "resuming" } else { "pausing" }))?;
    let verb = if resume { "resumed" } else { "paused" };
    if changed {
        println!("{verb} {what}");
    } else {
        println!("{what} was already {verb}");
    }
    Ok(())
}
