//! `dbworker cron`: a cron scheduler as a process of its own, from a crontab
//! file (graphile_worker's format, `./crontab` by default): each tick is
//! enqueued exactly once however many run, every interval until stopped, or
//! one pass with `--once`.

use dbworker::Service;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::cron::{Crontab, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions};

use crate::args::{TableArgs, duration};
use crate::signal::stop_on_signal;

#[derive(Debug, Args)]
pub(crate) struct CronArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The crontab file: one schedule a line, `<minute> <hour> <day> <month>
    /// <weekday> <kind> [?options] [payload JSON]`.
    #[arg(long, env = "DBWORKER_CRONTAB", default_value = "crontab")]
    crontab: PathBuf,
    /// The cron table (`dbworker migration --cron`).
    #[arg(long, default_value = DEFAULT_CRON_TABLE)]
    cron_table: String,
    /// Time between looks for due ticks.
    #[arg(long, default_value = "1s", value_parser = duration)]
    interval: Duration,
    /// Run one pass, print the jobs it enqueued, and exit.
    #[arg(long)]
    once: bool,
}

pub(crate) async fn cron(args: CronArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.crontab)
        .with_context(|| format!("reading the crontab {}", args.crontab.display()))?;
    let crontab =
        Crontab::parse(&text).with_context(|| format!("the crontab {}", args.crontab.display()))?;
    let mut options = SchedulerOptions::default();
    options.cron_table = args.cron_table;
    options.interval = args.interval;
    options.validate()?;
    let pool = args.table.target.connect().await?;
    let table = args.table.job_table_with(&pool, |_| {}).await?;
    let scheduler = Scheduler::new(&pool, &table, options)
        .await
        .with_context(|| format!("the cron scheduler of {}", args.table.target.table))?
        .crontab(&crontab)
        .with_context(|| format!("the crontab {}", args.crontab.display()))?;
    if args.once {
        let enqueued = scheduler
            .tick()
            .await
            .with_context(|| format!("ticking the schedules of {}", args.table.target.table))?;
        println!("enqueued {} job(s)", enqueued.len());
        for (schedule, id) in enqueued {
            println!("{}: job {id}", crate::commands::text::printable(&schedule));
        }
        return Ok(());
    }
    tracing::info!(
        table = %args.table.target.table,
        schedules = crontab.entries().len(),
        "cron scheduler running; stop with SIGINT or SIGTERM"
    );
    scheduler.run(stop_on_signal()).await?;
    Ok(())
}
