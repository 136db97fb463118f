//! `dbworker`: run the resetter or the purger as its own process, or print a
//! job table's DDL.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dbworker::{
    DEFAULT_CRON_TABLE, DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, OptionalColumns, PurgeOptions,
    Purger, Resetter, ResetterOptions, cron_table_sql, enqueue_function_sql, job_table_sql,
    limit_table_sql, notify_trigger_sql, optional_columns_sql, pause_table_sql,
};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use workerutil::JobState;

#[derive(Debug, Parser)]
#[command(name = "dbworker", version, about = "Operate dbworker job tables")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Requeue (or fail) stalled processing jobs, every interval, until stopped.
    Reset(ResetArgs),
    /// Print the CREATE TABLE and indexes for a new job table.
    Migration(MigrationArgs),
    /// Delete (or archive) finished jobs older than their state's age.
    Purge(PurgeArgs),
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// The database to connect to.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The job table, optionally schema-qualified.
    #[arg(long, env = "DBWORKER_TABLE")]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
    /// Purge completed jobs this many seconds after they finished. With none of
    /// the three ages given: completed after 7 days, failed and canceled after 30.
    #[arg(long)]
    completed_after_secs: Option<f64>,
    /// Purge failed jobs this many seconds after they finished.
    #[arg(long)]
    failed_after_secs: Option<f64>,
    /// Purge canceled jobs this many seconds after they finished.
    #[arg(long)]
    canceled_after_secs: Option<f64>,
    /// Rows per statement (each batch is a short transaction).
    #[arg(long, default_value_t = 1000)]
    batch_size: u32,
    /// Move rows to this table (same columns as the job table) instead of deleting.
    #[arg(long)]
    archive_table: Option<String>,
    /// Seconds between passes.
    #[arg(long, default_value_t = 60.0)]
    interval_secs: f64,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
}

async fn purge(args: PurgeArgs) -> Result<(), String> {
    let mut options = PurgeOptions::new(&args.table);
    options.alternate_column_names = args.renames.into_iter().collect::<HashMap<_, _>>();
    let ages = [
        (
            JobState::Completed,
            args.completed_after_secs,
            "completed-after-secs",
        ),
        (
            JobState::Failed,
            args.failed_after_secs,
            "failed-after-secs",
        ),
        (
            JobState::Canceled,
            args.canceled_after_secs,
            "canceled-after-secs",
        ),
    ];
    if ages.iter().any(|(_, age, _)| age.is_some()) {
        options.max_age = Vec::new();
        for (state, age, flag) in ages {
            if let Some(secs) = age {
                options.max_age.push((state, seconds(flag, secs)?));
            }
        }
    }
    options.batch_size = args.batch_size;
    options.archive_table = args.archive_table;
    options.interval = seconds("interval-secs", args.interval_secs)?;
    options.validate().map_err(|e| e.to_string())?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.database_url)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let purger = Purger::new(pool, options)
        .await
        .map_err(|e| e.to_string())?;
    if args.once {
        let purged = purger.purge_once().await.map_err(|e| e.to_string())?;
        for (state, n) in &purged.by_state {
            println!("purged {n} {} job(s)", state.as_str());
        }
        return Ok(());
    }
    tracing::info!(table = %args.table, "purger running; stop with SIGINT or SIGTERM");
    purger.run(stop_on_signal()).await;
    Ok(())
}

#[derive(Debug, Args)]
struct ResetArgs {
    /// The database to connect to.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The job table, optionally schema-qualified.
    #[arg(long, env = "DBWORKER_TABLE")]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
    /// Seconds without a heartbeat after which an unlocked processing job is stalled.
    #[arg(long, env = "DBWORKER_STALLED_MAX_AGE_SECS", default_value_t = 30.0)]
    stalled_max_age_secs: f64,
    /// Resets allowed before a stalled job is failed.
    #[arg(long, env = "DBWORKER_MAX_NUM_RESETS", default_value_t = 3)]
    max_num_resets: u32,
    /// The failure message of jobs failed for too many resets.
    #[arg(long, default_value = dbworker::DEFAULT_RESET_FAILURE_MESSAGE)]
    reset_failure_message: String,
    /// Seconds between passes.
    #[arg(long, env = "DBWORKER_RESET_INTERVAL_SECS", default_value_t = 30.0)]
    interval_secs: f64,
    /// Seconds to wait for the database before reporting it unreachable.
    #[arg(long, env = "DBWORKER_CONNECT_TIMEOUT_SECS", default_value_t = 5.0)]
    connect_timeout_secs: f64,
    /// Run one pass, print what it did, and exit.
    #[arg(long)]
    once: bool,
}

#[derive(Debug, Args)]
struct MigrationArgs {
    /// The new job table's name, optionally schema-qualified.
    #[arg(long)]
    table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
    /// Also print the trigger that NOTIFYs listening workers when jobs are queued.
    #[arg(long)]
    notify: bool,
    /// The NOTIFY channel (default: `dbworker_<table>`, what `Listen::TableChannel` listens on).
    #[arg(long, requires = "notify")]
    channel: Option<String>,
    /// Also add a `job_key` column and its unique index (job keys).
    #[arg(long)]
    keys: bool,
    /// Also add a `queue` column.
    #[arg(long)]
    queue: bool,
    /// Also add a `priority` column and its dequeue index.
    #[arg(long)]
    priority: bool,
    /// Also add a `max_retries` column (per-job retry limits).
    #[arg(long)]
    max_retries: bool,
    /// Also add a `kind` column (many kinds of job in one table).
    #[arg(long)]
    kind: bool,
    /// Also create the pause table (`dbworker_pauses`), shared by every job table.
    #[arg(long)]
    pauses: bool,
    /// Also add the index the purger uses (`finished_at` over final states).
    #[arg(long)]
    retention: bool,
    /// Also create the limit table (`dbworker_limits`), shared by every job table.
    #[arg(long)]
    limits: bool,
    /// Also create the cron table (`dbworker_cron`), shared by every job table.
    #[arg(long)]
    cron: bool,
    /// Also print `<table>_enqueue(fields jsonb, run_at, ...)`, a SQL function
    /// for producers in other languages (with the optional columns chosen above).
    #[arg(long)]
    enqueue_function: bool,
}

fn migration(args: MigrationArgs) -> Result<(), String> {
    let renames = args.renames.into_iter().collect();
    let mut ddl = job_table_sql(&args.table, &renames).map_err(|e| e.to_string())?;
    let mut optional = OptionalColumns::default();
    optional.keys = args.keys;
    optional.queue = args.queue;
    optional.priority = args.priority;
    optional.max_retries = args.max_retries;
    optional.kind = args.kind;
    optional.retention = args.retention;
    if optional != OptionalColumns::default() {
        ddl.push('\n');
        ddl.push_str(
            &optional_columns_sql(&args.table, &renames, optional).map_err(|e| e.to_string())?,
        );
    }
    if args.cron {
        ddl.push('\n');
        ddl.push_str(&cron_table_sql(DEFAULT_CRON_TABLE).map_err(|e| e.to_string())?);
    }
    if args.limits {
        ddl.push('\n');
        ddl.push_str(&limit_table_sql(DEFAULT_LIMIT_TABLE).map_err(|e| e.to_string())?);
    }
    if args.pauses {
        ddl.push('\n');
        ddl.push_str(&pause_table_sql(DEFAULT_PAUSE_TABLE).map_err(|e| e.to_string())?);
    }
    if args.enqueue_function {
        ddl.push('\n');
        ddl.push_str(
            &enqueue_function_sql(&args.table, &renames, optional).map_err(|e| e.to_string())?,
        );
    }
    if args.notify {
        ddl.push('\n');
        ddl.push_str(
            &notify_trigger_sql(&args.table, &renames, args.channel.as_deref())
                .map_err(|e| e.to_string())?,
        );
    }
    print!("{ddl}");
    Ok(())
}

fn parse_rename(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!("expected standard=actual, got {s:?}")),
    }
}

fn seconds(flag: &str, secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|e| format!("--{flag}: {e}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Migration(args) => migration(args),
        Command::Purge(args) => purge(args).await,
        Command::Reset(args) => reset(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("dbworker: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn reset(args: ResetArgs) -> Result<(), String> {
    let mut options = ResetterOptions::new("dbworker_resetter", &args.table);
    options.alternate_column_names = args.renames.into_iter().collect::<HashMap<_, _>>();
    options.stalled_max_age = seconds("stalled-max-age-secs", args.stalled_max_age_secs)?;
    options.max_num_resets = args.max_num_resets;
    options.reset_failure_message = args.reset_failure_message;
    options.interval = seconds("interval-secs", args.interval_secs)?;
    options.connect_timeout = seconds("connect-timeout-secs", args.connect_timeout_secs)?;
    options.validate().map_err(|e| e.to_string())?;
    // Lazy: `check` below connects with the timeout and reports the real cause.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(options.connect_timeout)
        .connect_lazy(&args.database_url)
        .map_err(|e| format!("invalid DATABASE_URL: {e}"))?;
    let resetter = Resetter::new(pool, options).map_err(|e| e.to_string())?;
    resetter.check().await.map_err(|e| e.to_string())?;
    if args.once {
        let out = resetter.reset_once().await.map_err(|e| e.to_string())?;
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
    tracing::info!(table = %args.table, "resetter running; stop with SIGINT or SIGTERM");
    resetter
        .run(stop_on_signal(), |out| {
            if !out.reset.is_empty() || !out.failed.is_empty() {
                tracing::info!(
                    reset = out.reset.len(),
                    failed = out.failed.len(),
                    "reset pass"
                );
            }
        })
        .await;
    Ok(())
}

/// A token canceled by SIGINT or SIGTERM.
fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        on_signal.cancel();
    });
    stop
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
