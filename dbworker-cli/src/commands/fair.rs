//! `dbworker fair`: a fair table's keys — what each has waiting and running,
//! and its weight — and setting or removing weights.

use anyhow::{Context, Result};
use clap::Args;
use dbworker::control::FairWeights;

use crate::args::TableArgs;

#[derive(Debug, Args)]
pub(crate) struct FairArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Give a key a weight, as `key=weight` (1 to 10000; repeatable).
    #[arg(long = "set", value_parser = parse_weight)]
    set: Vec<(String, u32)>,
    /// Put a key back to weight 1 (repeatable).
    #[arg(long = "remove")]
    remove: Vec<String>,
    /// How many keys to show, most waiting first.
    #[arg(long, default_value_t = 20)]
    top: u32,
}

fn parse_weight(s: &str) -> Result<(String, u32), String> {
    let (key, weight) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s:?} is not key=weight"))?;
    let weight = weight
        .parse()
        .map_err(|_| format!("weight {weight:?} is not a whole number"))?;
    Ok((key.to_owned(), weight))
}

/// Applies the changes asked for, then prints the keys with work.
pub(crate) async fn fair(args: FairArgs) -> Result<()> {
    let pool = args.table.target.connect().await?;
    let table = args.table.job_table_with(&pool, |o| o.fair = true).await?;
    let weights = FairWeights::new(&pool, &table).await?;
    if !args.set.is_empty() || !args.remove.is_empty() {
        weights.check_writes().await?;
    }
    for (key, weight) in &args.set {
        weights
            .set(key, *weight)
            .await
            .with_context(|| format!("setting the weight of {key:?}"))?;
        println!("weight of {key:?} is {weight}");
    }
    for key in &args.remove {
        let had = weights.remove(key).await?;
        println!(
            "weight of {key:?} is 1{}",
            if had { "" } else { " (it was)" }
        );
    }
    let shares = weights.shares(args.top).await?;
    println!(
        "{:<32} {:>10} {:>10} {:>7}",
        "KEY", "WAITING", "RUNNING", "WEIGHT"
    );
    for s in shares {
        // Keys come from the jobs' fair_key: whoever enqueued chose them.
        let key = crate::commands::text::printable(s.key.as_deref().unwrap_or("(none)"));
        println!(
            "{key:<32} {:>10} {:>10} {:>7}",
            s.waiting, s.processing, s.weight
        );
    }
    Ok(())
}
