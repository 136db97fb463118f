//! `dbworker signal`: sends a job the signal it waits for (`migration --signals`);
//! not the process signals of `signal.rs`.

use anyhow::{Context, Result};
use clap::Args;
use dbworker::Signals;
use dbworker::admin::Admin;

use crate::args::TableArgs;

#[derive(Debug, Args)]
pub(crate) struct SignalArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The job's id.
    #[arg(long, conflicts_with = "key", required_unless_present = "key")]
    id: Option<i64>,
    /// The key of the live job to signal (a keyed table).
    #[arg(long)]
    key: Option<String>,
    /// The signal's name.
    #[arg(long)]
    name: String,
    /// The signal's payload, as JSON.
    #[arg(long, default_value = "null")]
    payload: String,
    /// A dedupe key: a signal sent again with it is delivered once.
    #[arg(long)]
    dedupe: Option<String>,
}

/// Sends the signal and says whether it was new.
pub(crate) async fn signal(args: SignalArgs) -> Result<()> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .map_err(|err| crate::exit::usage(format!("--payload is not JSON: {err}")))?;
    let pool = args.table.target.connect().await?;
    let table = args
        .table
        .job_table_with(&pool, |o| o.signals = true)
        .await?;
    let signals = Signals::new(&pool, &table).await?;
    // Every missing grant named before anything is sent.
    Admin::new(&pool, &table).await?.check_signals().await?;
    let dedupe = args.dedupe.as_deref();
    let new = match (&args.id, &args.key) {
        (Some(id), _) => signals.send(*id, &args.name, payload, dedupe).await,
        (None, Some(key)) => signals.send_to_key(key, &args.name, payload, dedupe).await,
        (None, None) => unreachable!("clap requires --id or --key"),
    }
    .map_err(|err| match crate::exit::no_data_found(&err) {
        // The signal functions say an unknown job or key so.
        Some(missing) => crate::exit::not_found(missing),
        None => err.into(),
    })
    .with_context(|| format!("sending signal {:?}", args.name))?;
    let name = crate::commands::text::printable(&args.name);
    if new {
        println!("sent {name}");
    } else {
        println!("{name} was sent before with this dedupe key: delivered once");
    }
    Ok(())
}
