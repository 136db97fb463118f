//! The benchmark: dbworker beside the raw-SQL floor, in one run.
//!
//! ```sh
//! cargo run --release -p dbworker-bench -- --jobs 100000
//! cargo run --release -p dbworker-bench -- --jobs 100000 --write-docs   # also records it in docs/
//! ```
//!
//! With `DATABASE_URL` unset it starts a throwaway PostgreSQL cluster with
//! durable settings (fsync, synchronous_commit and full_page_writes on) and
//! `pg_stat_statements` preloaded, and removes it at the end; with it set, it
//! works in a scratch database on that server. Workloads, in order:
//!
//! - enqueue N no-op jobs in batches (jobs/s);
//! - burn-down in heartbeat handling per handler count, each run next to the
//!   raw-SQL floor (claim 100 + complete 100 rows per statement at 16
//!   connections);
//! - burn-down in transactional handling per handler count, each next to the
//!   floor of a batch claim plus one transaction per job at the same concurrency;
//! - insert → handler start latency at a low rate, NOTIFY on and off; then
//!   from `--producers` concurrent connections at `--producers-rate` (NOTIFY
//!   on), with and without a snapshot that holds the xmin;
//! - both burn-downs again with 1,000,000 completed rows in the table, with
//!   jobs/s per second so that decay would show;
//! - peak RSS of a worker process at 64 handlers;
//! - the peers (`--peers`, default graphile; `--no-peers` for none):
//!   graphile_worker (Rust), built from `bench-peers/graphile/` (outside the
//!   workspace) on demand, beside dbworker with LISTEN on and the floor at 24
//!   and 100 handlers, and its pickup latency.
//! - the cost of dependency release (`workflows`): fan-ins, chains and
//!   diamonds beside the plain burn-down.
//! - partitioned job tables (`partitioned`): the burn-down on the plain table,
//!   on a table partitioned by day with the jobs in ten partitions, and there
//!   again while a purger drops old partitions beside it.
//! - fair claims (`fair`, only when asked for): burn-downs, the enqueue
//!   paths and a claim on a large backlog (with its plan), each beside the
//!   plain table, and where the tagging trigger's time goes.
//! - long jobs (`long`, only when asked for): trace capture on enqueue,
//!   signal → resume latency and checkpoint cost, each in interleaved
//!   rounds beside the plain path.
//!
//! Only ratios within one run mean much: absolute figures on a shared machine
//! drift between minutes.
//!
//! Diagnostics (environment variables, never in a recorded run):
//! `BENCH_TOP_STATEMENTS=1` prints each run's top statements from
//! `pg_stat_statements` (`=all` counts those that functions and triggers run
//! too, `pg_stat_statements.track = all`: where a trigger's time goes);
//! `BENCH_WORKFLOW_RUNS=0,2` makes only those runs of the `workflows`
//! workload (indexes into `workflows::Shape::RUNS`; keep 0, the plain run);
//! `BENCH_MAX_CLAIM_AHEAD=N` sets the workers' `max_claim_ahead`, to compare
//! bounds with one build, `BENCH_CLAIM_AHEAD=N` a fixed `claim_ahead` and
//! `BENCH_CONCURRENT_DEQUEUES=N` the claims in flight at once (a value that
//! is not a number is refused);
//! `BENCH_FLOOR=one-write` (or `lock-delete`) makes the heartbeat floor lock
//! and complete (or delete) each batch in one transaction (each row written
//! once; see `floor`; another value is refused);
//! `BENCH_WRAP_WORKER=heaptrack` runs the `rss` workload's worker process
//! (and the peer comparison's) under that program (a heap profile of the
//! measured run; `bench/cpu/perf-record.sh` for a CPU profile);
//! `BENCH_TABLE_LAYOUT=hot` gives the table the HOT layout
//! (`dbworker::ddl::hot_layout_sql`; the floor's claim then names its
//! column, as dbworker's does), and `BENCH_FILLFACTOR=N` that layout with
//! another fill factor.

mod args;
mod bloat;
mod chart;
mod dashboard;
mod db;
mod docs_merge;
mod fair;
mod floor;
mod framework;
mod latency;
mod long;
mod machine;
mod ops;
mod pairs;
mod partitioned;
mod peers;
mod pooler;
mod processes;
mod provenance;
mod report;
mod run;
mod table;
mod workflows;

use std::path::Path;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::args::{BenchArgs, Workload};
use crate::db::Bench;
use crate::pairs::{heartbeat_pair, transactional_pair};
use crate::report::Report;

/// The workspace's root (this package is its `bench/` folder): docs/,
/// bench-peers/ and the code version are read there.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ is a folder of the workspace")
}

/// Errors of the benchmark: reported, never handled.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Parser)]
#[command(
    about = "dbworker beside the raw-SQL floor",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one worker over an existing table and prints its peak RSS (the
    /// benchmark starts this itself).
    #[command(hide = true)]
    Worker(framework::ChildArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Command::Worker(args)) = cli.command {
        return framework::child_worker(args).await;
    }
    // On Ctrl-C the benchmark future is dropped, and with it the scratch
    // database and the throwaway cluster.
    tokio::select! {
        result = bench(cli.bench) => result,
        _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
    }
}

/// Runs the selected workloads and reports them.
async fn bench(args: BenchArgs) -> Result<()> {
    if args.jobs == 0
        || args.handlers.contains(&0)
        || args.tx_handlers.contains(&0)
        || args.peer_handlers.contains(&0)
    {
        return Err("--jobs and every handler count must be at least 1".into());
    }
    if args.pooler_processes.len() != args.pooler_handlers.len() {
        return Err(format!(
            "--pooler-processes has {} entries and --pooler-handlers {}: give one handler count per process count",
            args.pooler_processes.len(),
            args.pooler_handlers.len()
        )
        .into());
    }
    // Built first, so that a failing build stops the run before it starts and
    // compiling does not share the machine with a measurement.
    let mut peer_bins = Vec::new();
    // Beside the heartbeat burn-downs and the latency runs only.
    let with_peers =
        !args.no_peers && (args.runs(Workload::Heartbeat) || args.runs(Workload::Latency));
    for &peer in args.peers.iter().filter(|_| with_peers) {
        match peers::build(peer).await {
            Ok(bin) => peer_bins.push(bin),
            Err(err) => progress(format_args!("peers: {peer:?} skipped: {err}")),
        }
    }
    let bench = Bench::start().await?;
    let mut report = Report::new(&bench).await?;
    report.print_header();

    if args.runs(Workload::Enqueue) {
        bench.fresh_table(0).await?;
        let took = bench.enqueue(args.jobs, args.enqueue_batch).await?;
        report.enqueue = Some((args.jobs, args.enqueue_batch, took));
        progress(format_args!(
            "enqueue: {} jobs in {:.2} s",
            args.jobs,
            took.as_secs_f64()
        ));
    }
    if args.runs(Workload::Heartbeat) {
        for &h in &args.handlers {
            let pair = heartbeat_pair(&bench, &args, h, 0).await?;
            report.heartbeat.push(pair);
        }
    }
    if args.runs(Workload::Transactional) {
        for &h in &args.tx_handlers {
            let pair = transactional_pair(&bench, &args, h, 0).await?;
            report.transactional.push(pair);
        }
    }
    if args.runs(Workload::Latency) {
        for notify in [false, true] {
            let result = latency::run(&bench, args.latency_jobs, args.latency_rate, notify).await?;
            progress(format_args!(
                "latency: p50 {:?}, p99 {:?}",
                result.p50, result.p99
            ));
            report.latency.push(result);
        }
        for hold_xmin in [false, true].into_iter().filter(|_| args.producers > 0) {
            let result = latency::run_many(
                &bench,
                args.producers_jobs,
                args.producers_rate,
                args.producers,
                hold_xmin,
            )
            .await?;
            progress(format_args!(
                "latency: {}: p50 {:?}, p99 {:?}, max {:?}",
                result.label, result.p50, result.p99, result.max
            ));
            report.latency_many.push(result);
        }
    }
    if args.runs(Workload::Big) && args.completed_rows > 0 {
        let h = args.handlers.iter().copied().filter(|&h| h <= 64).max();
        let tx_h = if args.tx_handlers.contains(&24) {
            Some(24)
        } else {
            args.tx_handlers.first().copied()
        };
        if let Some(h) = h {
            let pair = heartbeat_pair(&bench, &args, h, args.completed_rows).await?;
            report.big.push(pair);
        }
        if let Some(h) = tx_h {
            let pair = transactional_pair(&bench, &args, h, args.completed_rows).await?;
            report.big.push(pair);
        }
    }
    if args.runs(Workload::Rss) {
        for (mode, jobs) in [
            (db::Mode::Heartbeat, args.jobs.min(20_000)),
            (db::Mode::Transactional, args.tx_jobs().min(5_000)),
        ] {
            let rss = framework::measure_rss(&bench, mode, args.rss_handlers, jobs).await?;
            progress(format_args!(
                "rss: {} at {} handlers: {} KiB",
                mode, rss.handlers, rss.vmhwm_kib
            ));
            report.rss.push(rss);
        }
    }

    if args.runs(Workload::Ops) {
        let handlers = args
            .handlers
            .iter()
            .copied()
            .filter(|&h| h <= 64)
            .max()
            .unwrap_or(64);
        for variant in [
            ops::Variant::Plain,
            ops::Variant::Kinds,
            ops::Variant::Limited,
            ops::Variant::RateLimited,
        ] {
            ops::prepare(&bench, variant, args.jobs, args.enqueue_batch).await?;
            let run = ops::burn(&bench, variant, handlers, args.jobs).await?;
            progress(format_args!(
                "ops: {} at {handlers} handlers: {:.0} jobs/s",
                variant.label(),
                run.rate()
            ));
            report.ops.push((variant.label().to_owned(), handlers, run));
        }
    }
    if args.runs(Workload::Workflows) {
        let handlers = args
            .handlers
            .iter()
            .copied()
            .filter(|&h| h <= 64)
            .max()
            .unwrap_or(64);
        for (shape, cursor) in workflows::Shape::selected() {
            let jobs = workflows::prepare(&bench, shape, args.jobs, args.enqueue_batch).await?;
            let run = workflows::burn(&bench, (shape, cursor), handlers, jobs).await?;
            let label = shape.label(cursor);
            progress(format_args!(
                "workflows: {label} at {handlers} handlers: {:.0} jobs/s",
                run.rate()
            ));
            report.workflows.push((label, handlers, run));
        }
        workflows::drop_edges(&bench).await?;
    }
    if args.runs(Workload::Partitioned) {
        let handlers = args
            .handlers
            .iter()
            .copied()
            .filter(|&h| h <= 64)
            .max()
            .unwrap_or(64);
        let runs = partitioned::run(
            &bench,
            handlers,
            args.jobs,
            args.partition_old_rows,
            args.enqueue_batch,
        )
        .await?;
        for r in &runs {
            progress(format_args!(
                "partitioned: {} at {handlers} handlers: {:.0} jobs/s",
                r.label,
                r.run.rate()
            ));
        }
        report.partitioned = runs;
    }
    if args.runs(Workload::Fair) {
        let sizes = (args.jobs, args.enqueue_batch);
        report.fair = Some(fair::run(&bench, &args.fair, &args.handlers, sizes).await?);
    }
    // Printed after the report's tables (not recorded by --write-docs).
    let long = match args.runs(Workload::Long) {
        true => Some(long::run(&bench, &args.long).await?),
        false => None,
    };
    if args.runs(Workload::Processes) && !args.processes.is_empty() {
        bench.prepare(0, args.jobs, args.enqueue_batch).await?;
        let floor =
            floor::heartbeat(&bench, args.floor_connections, args.floor_batch, args.jobs).await?;
        progress(format_args!("processes: floor {:.0} jobs/s", floor.rate()));
        report.processes_floor = Some(floor);
        for &n in &args.processes {
            let run = processes::run(
                &bench,
                n,
                args.process_handlers,
                args.jobs,
                args.enqueue_batch,
            )
            .await?;
            progress(format_args!(
                "processes: {n} × {} handlers: {:.0} jobs/s",
                args.process_handlers,
                run.rate()
            ));
            report.processes.push((n, args.process_handlers, run));
        }
    }
    if args.runs(Workload::Pooler) {
        for (&processes, &handlers) in args.pooler_processes.iter().zip(&args.pooler_handlers) {
            let sizes = pooler::Sizes {
                processes,
                handlers,
                jobs: args.jobs,
                tx_jobs: args.tx_jobs(),
                batch: args.enqueue_batch,
                floor_connections: args.floor_connections,
                floor_batch: args.floor_batch,
            };
            let Some(runs) = pooler::run(&bench, &sizes).await? else {
                break;
            };
            report.pooler.extend(runs);
        }
    }
    if args.runs(Workload::Bloat) {
        let floor = (args.floor_connections, args.floor_batch);
        // `--bloat-jobs 0`: the offered-load runs alone.
        for &claims in args.bloat_claims.iter().filter(|_| args.bloat_jobs > 0) {
            let run = bloat::burn_down(&bench, args.bloat_jobs, args.enqueue_batch, claims, floor)
                .await?;
            progress(format_args!("bloat: burn-down {run:?}"));
            report.bloat_burn_downs.push(run);
        }
        for &claims in &args.bloat_claims {
            let run = bloat::offered(
                &bench,
                args.bloat_rate,
                args.bloat_seconds,
                args.bloat_pin_seconds,
                claims,
                floor,
            )
            .await?;
            progress(format_args!("bloat: offered {run:?}"));
            report.bloat_offered.push(run);
        }
    }
    if args.runs(Workload::Dashboard) {
        let pages =
            dashboard::run(&bench, args.completed_rows, 100_000, args.enqueue_batch, 20).await?;
        for (page, p50, p95) in &pages {
            progress(format_args!("dashboard: {page}: p50 {p50:?}, p95 {p95:?}"));
        }
        report.dashboard = pages;
    }
    for exe in &peer_bins {
        let handler_counts: &[usize] = if args.runs(Workload::Heartbeat) {
            &args.peer_handlers
        } else {
            &[]
        };
        let latency_jobs = if args.runs(Workload::Latency) {
            args.latency_jobs
        } else {
            0
        };
        let runs = peers::run(
            &bench,
            exe,
            handler_counts,
            args.jobs,
            args.enqueue_batch,
            args.floor_connections,
            args.floor_batch,
            latency_jobs,
            args.latency_rate,
            peers::ManyProducers {
                producers: args.producers,
                rate: args.producers_rate,
                jobs: args.producers_jobs,
            },
        )
        .await?;
        report.peers.push(runs);
    }
    report.print_tables();
    for table in long.iter().flat_map(long::tables) {
        println!("{}", table.text());
    }
    if args.write_docs {
        let written = report.write_docs()?;
        println!("\nwrote {}", written.join(", "));
    }
    bench.close().await;
    Ok(())
}

/// A progress line on stderr; the tables go to stdout at the end.
fn progress(line: std::fmt::Arguments<'_>) {
    eprintln!("bench: {line}");
}

/// How long a run may take before the benchmark gives up on it.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
