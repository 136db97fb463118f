//! `dbworker history`: records a job table's history (finished jobs per
//! queue and minute, downsampled to hours, kept for `--keep`), what the
//! dashboard's charts and `dbworker top` read; every interval until
//! stopped, or one pass with `--once`. Any number may run at once.

use dbworker::Service;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::history::{DEFAULT_HISTORY_TABLE, History, HistoryOptions};

use crate::args::{TableArgs, duration};
use crate::signal::stop_on_signal;

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The history table (`dbworker migration --history`).
    #[arg(long, default_value = DEFAULT_HISTORY_TABLE)]
    history_table: String,
    /// Time between passes.
    #[arg(long, default_value = "30s", value_parser = duration)]
    interval: Duration,
    /// Minutes older than this become hours (sums exact, percentiles approximated).
    #[arg(long, default_value = "1d", value_parser = duration)]
    downsample_after: Duration,
    /// Rows older than this are deleted.
    #[arg(long, default_value = "14d", value_parser = duration)]
    keep: Duration,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
}

pub(crate) async fn history(args: HistoryArgs) -> Result<()> {
    let mut options = HistoryOptions::default();
    options.history_table = args.history_table;
    options.interval = args.interval;
    options.downsample_after = args.downsample_after;
    options.keep = args.keep;
    options.validate()?;
    let pool = args.table.target.connect().await?;
    let table = args.table.job_table_with(&pool, |_| {}).await?;
    let history = History::new(&pool, &table, options)
        .await
        .with_context(|| format!("history of {}", args.table.target.table))?;
    if args.once {
        let r = history
            .record_once()
            .await
            .with_context(|| format!("recording the history of {}", args.table.target.table))?;
        println!(
            "recorded {} minute row(s), downsampled into {} hour row(s), removed {} old row(s)",
            r.minutes, r.hours, r.removed
        );
        return Ok(());
    }
    tracing::info!(table = %args.table.target.table, "history running; stop with SIGINT or SIGTERM");
    history.run(stop_on_signal()).await?;
    Ok(())
}
