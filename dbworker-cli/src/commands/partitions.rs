//! `dbworker partitions create`: the upcoming partitions of a partitioned job
//! table (`migration --partitioned`), for a cron job when no purger runs.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dbworker::maintenance::{PurgeOptions, Purger};

use crate::args::Target;

#[derive(Debug, Args)]
pub(crate) struct PartitionsArgs {
    #[command(subcommand)]
    command: PartitionsCommand,
}

#[derive(Debug, Subcommand)]
enum PartitionsCommand {
    /// Create the missing partitions from the current one to --ahead
    /// intervals past it; prints each one created.
    Create {
        #[command(flatten)]
        target: Target,
        /// How many intervals past the current one to create.
        #[arg(long, default_value_t = 3)]
        ahead: u32,
    },
}

pub(crate) async fn partitions(args: PartitionsArgs) -> Result<()> {
    let PartitionsCommand::Create { target, ahead } = args.command;
    let mut options = PurgeOptions::new();
    options.partitions_ahead = ahead;
    let pool = target.connect().await?;
    let table = target.job_table(&pool).await?;
    let purger = Purger::new(&pool, &table, options)
        .await
        .with_context(|| format!("partitions of {}", target.table))?;
    if !purger.is_partitioned() {
        anyhow::bail!(
            "{} is not a partitioned table (`dbworker migration --partitioned` makes one)",
            target.table
        );
    }
    let created = purger.create_partitions().await?;
    for name in &created {
        println!("created {}", crate::commands::text::printable(name));
    }
    println!("{} partition(s) created", created.len());
    Ok(())
}
