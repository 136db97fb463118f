//! dbworker runs: burn-downs through `new_worker` with a no-op handler, and the
//! worker child process whose peak RSS is measured.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbworker::{
    DbJob, DbStore, Handling, JobTable, JobTableOptions, RESERVED_CONNECTIONS, StoreOptions,
    new_worker,
};
use tokio_util::sync::CancellationToken;
use workerutil::{
    Handler, HandlerError, JobContext, Outcome, Record, Worker, WorkerOptions, WorkerSummary,
};

use crate::db::{Bench, Mode, TABLE};
use crate::report::Run;
use crate::{RUN_TIMEOUT, Result};

/// A job of the bench table: only its id is read.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct BenchJob {
    id: i64,
}

impl Record for BenchJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// When handlers started, by job id (the latency runs).
pub(crate) type Starts = Arc<Mutex<HashMap<i64, Instant>>>;

/// Does nothing, and counts jobs whose outcome was recorded.
pub(crate) struct NoOp {
    pub(crate) progress: Arc<Progress>,
    /// Set in latency runs: every handler's start.
    pub(crate) starts: Option<Starts>,
}
impl Handler<DbStore<BenchJob>> for NoOp {
    async fn handle(
        &self,
        job: &mut DbJob<BenchJob>,
        _ctx: &JobContext<DbStore<BenchJob>>,
    ) -> std::result::Result<(), HandlerError> {
        if let Some(starts) = &self.starts {
            let now = Instant::now();
            starts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(job.record().id, now);
        }
        Ok(())
    }

    // Runs after the outcome was written: the job is done from the table's view.
    async fn post_handle(&self, _record: &BenchJob, _outcome: &Outcome) {
        self.progress.add(1);
    }
}

/// Finished jobs of a run and when the last one finished; sampled once a second.
#[derive(Debug)]
pub(crate) struct Progress {
    start: Instant,
    done: AtomicU64,
    last_ns: AtomicU64,
}

impl Progress {
    pub(crate) fn new() -> Arc<Progress> {
        Arc::new(Progress {
            start: Instant::now(),
            done: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
        })
    }

    /// Counts `n` more finished jobs, finished now.
    pub(crate) fn add(&self, n: u64) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.fetch_max(ns, Ordering::Relaxed);
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// From the start to the last finish.
    pub(crate) fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.last_ns.load(Ordering::Relaxed))
    }

    /// Samples the count once a second until `stop`; returns jobs per second.
    pub(crate) fn sample(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<Vec<u64>> {
        let progress = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(
                tokio::time::Instant::from_std(progress.start) + Duration::from_secs(1),
                Duration::from_secs(1),
            );
            let (mut series, mut before) = (Vec::new(), 0);
            loop {
                tokio::select! {
                    _ = ticks.tick() => {
                        let now = progress.done();
                        series.push(now - before);
                        before = now;
                    }
                    _ = stop.cancelled() => return series,
                }
            }
        })
    }
}

/// The bench table as its stores see it (`{TABLE} j`, the standard columns).
pub(crate) fn table_options() -> JobTableOptions {
    let mut options = JobTableOptions::new(format!("{TABLE} j"));
    // The bench's record is its id: a claim reads nothing more.
    options.column_expressions = vec!["j.id".into()];
    options
}

/// The bench table, described and checked on `pool`: built in each run, where
/// the run's store is (the workloads drop and create the table between runs,
/// and the description records what the check found, e.g. partitioning).
pub(crate) async fn job_table(pool: &sqlx::PgPool) -> Result<JobTable> {
    Ok(JobTable::new(pool, table_options()).await?)
}

/// Store options for the bench table in `mode`.
pub(crate) fn store_options(mode: Mode) -> StoreOptions {
    let mut options = StoreOptions::new("bench");
    options.handling = match mode {
        Mode::Heartbeat => Handling::Heartbeat,
        Mode::Transactional => Handling::Transactional,
    };
    options
}

/// Worker options for a run of `handlers` handlers; `jobs` stops it after that
/// many. A diagnostic setting that does not parse is refused.
pub(crate) fn worker_options(handlers: usize, jobs: Option<u64>) -> Result<WorkerOptions> {
    let mut options = WorkerOptions::new("bench");
    options.hostname = Some("bench".into());
    options.num_handlers = handlers;
    options.num_total_jobs = jobs;
    // Only matters when a claim finds nothing (the end of a burn-down).
    options.interval = Duration::from_millis(10);
    // A diagnostic knob (like BENCH_TOP_STATEMENTS): compare claim-ahead
    // bounds in one build; child worker processes inherit it.
    if let Some(bound) = env_count("BENCH_MAX_CLAIM_AHEAD")? {
        options.max_claim_ahead = Some(bound);
    }
    // The same for a fixed allowance (the adaptive one turned off).
    if let Some(ahead) = env_count("BENCH_CLAIM_AHEAD")? {
        options.claim_ahead = Some(ahead);
    }
    // And for the claims in flight at once while the queue is busy.
    if let Some(claims) = env_count("BENCH_CONCURRENT_DEQUEUES")? {
        options.concurrent_dequeues = Some(claims);
    }
    Ok(options)
}

/// A count from the environment: `None` when unset or empty, an error naming
/// the setting when it is not a number (a typo must not run the default).
fn env_count(name: &str) -> Result<Option<usize>> {
    count_setting(name, std::env::var(name).ok())
}

fn count_setting(name: &str, value: Option<String>) -> Result<Option<usize>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v}: expected a number of jobs").into()),
    }
}

/// The pool a worker gets: what `new_worker` requires, and for heartbeat
/// handling as many connections as the heartbeat floor (16) for its marks.
pub(crate) fn pool_size(mode: Mode, handlers: usize) -> u32 {
    let handlers = u32::try_from(handlers).unwrap_or(u32::MAX);
    match mode {
        Mode::Transactional => handlers.saturating_add(RESERVED_CONNECTIONS),
        Mode::Heartbeat => handlers.min(16) + RESERVED_CONNECTIONS,
    }
}

/// Burns down `jobs` queued jobs with `handlers` handlers; measures from the
/// start to the last recorded outcome.
pub(crate) async fn burn(bench: &Bench, mode: Mode, handlers: usize, jobs: u64) -> Result<Run> {
    burn_with(bench, mode, handlers, jobs, false).await
}

/// [`burn`], with LISTEN on when `listen` (the trigger and the worker options
/// of the latency workload's "NOTIFY on" run): the configuration the peers
/// are compared with.
pub(crate) async fn burn_with(
    bench: &Bench,
    mode: Mode,
    handlers: usize,
    jobs: u64,
    listen: bool,
) -> Result<Run> {
    let connections = pool_size(mode, handlers);
    let pool = bench.pool(connections).await?;
    let mut store_options = store_options(mode);
    let mut worker_options = worker_options(handlers, Some(jobs))?;
    if listen {
        crate::latency::enable_notify(&pool, &mut store_options, &mut worker_options).await?;
    }
    let table = job_table(&pool).await?;
    let (worker, progress) = noop_worker(&pool, &table, store_options, worker_options).await?;
    bench.reset_statements().await?;
    let label = format!("{mode} run with {handlers} handlers");
    measure(bench, &pool, &progress, jobs, &label, async {
        Ok(worker.run().await)
    })
    .await
}

/// A worker of no-op handlers on `table`, and the progress its outcomes
/// count.
pub(crate) async fn noop_worker(
    pool: &sqlx::PgPool,
    table: &JobTable,
    store_options: StoreOptions,
    worker_options: WorkerOptions,
) -> Result<(Worker<DbStore<BenchJob>, NoOp>, Arc<Progress>)> {
    let store = Arc::new(DbStore::new(pool, table, store_options).await?);
    let progress = Progress::new();
    let handler = NoOp {
        progress: progress.clone(),
        starts: None,
    };
    Ok((new_worker(store, handler, worker_options)?, progress))
}

/// Runs `run` (a worker burning down `jobs`) under the run timeout, sampling
/// `progress`, then checks that every job completed once; closes `pool`.
pub(crate) async fn measure(
    bench: &Bench,
    pool: &sqlx::PgPool,
    progress: &Arc<Progress>,
    jobs: u64,
    label: &str,
    run: impl std::future::Future<Output = Result<WorkerSummary>>,
) -> Result<Run> {
    let stop_sampling = CancellationToken::new();
    let sampler = progress.sample(stop_sampling.clone());
    let summary = tokio::time::timeout(RUN_TIMEOUT, run).await??;
    stop_sampling.cancel();
    let per_second = sampler.await?;
    let statements = bench.statements().await?;
    let connections = pool.options().get_max_connections();
    pool.close().await;
    let completed = bench.completed().await?;
    if summary.dequeued != jobs || completed != jobs {
        return Err(format!(
            "{label}: dequeued {} and completed {completed} of {jobs} jobs",
            summary.dequeued
        )
        .into());
    }
    Ok(Run {
        jobs,
        elapsed: progress.elapsed(),
        per_second,
        statements,
        connections,
    })
}

/// Arguments of the hidden `worker` subcommand.
#[derive(Debug, clap::Args)]
pub(crate) struct ChildArgs {
    /// The bench database.
    #[arg(long)]
    url: String,
    /// Handling mode.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Handlers.
    #[arg(long)]
    handlers: usize,
    /// Jobs to burn down (they must be queued already); without it, runs
    /// until SIGTERM (one of several processes sharing the queue).
    #[arg(long)]
    jobs: Option<u64>,
    /// `url` is a transaction pooler's (`Pooler::Transaction`).
    #[arg(long)]
    pooler: bool,
    /// The pool's connections; default: what the handlers need.
    #[arg(long)]
    connections: Option<u32>,
}

/// The worker process: burns down the queued jobs, then prints its peak RSS.
pub(crate) async fn child_worker(args: ChildArgs) -> Result<()> {
    if args.pooler {
        dbworker::set_pooler(dbworker::Pooler::Transaction { listen_url: None });
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(
            args.connections
                .unwrap_or_else(|| pool_size(args.mode, args.handlers)),
        )
        .test_before_acquire(false)
        .connect(&args.url)
        .await?;
    let table = job_table(&pool).await?;
    let store = Arc::new(DbStore::new(&pool, &table, store_options(args.mode)).await?);
    let progress = Progress::new();
    let handler = NoOp {
        progress: progress.clone(),
        starts: None,
    };
    let worker = new_worker(store, handler, worker_options(args.handlers, args.jobs)?)?;
    let shutdown = worker.shutdown_handle();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            shutdown.graceful();
        }
    });
    worker.run().await;
    pool.close().await;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .ok_or("no VmHWM in /proc/self/status")?
        .trim()
        .trim_end_matches("kB")
        .trim();
    println!("vmhwm_kib={hwm}");
    println!("jobs={}", progress.done());
    println!("seconds={:.3}", progress.elapsed().as_secs_f64());
    Ok(())
}

/// Peak RSS of a worker process.
#[derive(Debug, Clone)]
pub(crate) struct Rss {
    pub(crate) mode: Mode,
    pub(crate) handlers: usize,
    pub(crate) jobs: u64,
    pub(crate) vmhwm_kib: u64,
}

impl Rss {
    /// VmHWM in MiB (the kernel's "kB" are KiB).
    pub(crate) fn mib(&self) -> f64 {
        self.vmhwm_kib as f64 / 1024.0
    }
}

/// Runs this binary's `worker` subcommand over `jobs` queued jobs and reads the
/// peak RSS it reports.
pub(crate) async fn measure_rss(
    bench: &Bench,
    mode: Mode,
    handlers: usize,
    jobs: u64,
) -> Result<Rss> {
    bench.prepare(0, jobs, 5_000).await?;
    // A diagnostic knob: BENCH_WRAP_WORKER=heaptrack runs the worker under
    // that program (a heap profile of the same run).
    let exe = std::env::current_exe()?;
    let mut command = match std::env::var("BENCH_WRAP_WORKER") {
        Ok(wrapper) => {
            let mut c = tokio::process::Command::new(wrapper);
            c.arg(exe);
            c
        }
        Err(_) => tokio::process::Command::new(exe),
    };
    let output = command
        .args(["worker", "--url", bench.url(), "--mode", &mode.to_string()])
        .args([
            "--handlers",
            &handlers.to_string(),
            "--jobs",
            &jobs.to_string(),
        ])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_TIMEOUT, output).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "worker process failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let vmhwm_kib = stdout
        .lines()
        .find_map(|l| l.strip_prefix("vmhwm_kib="))
        .ok_or_else(|| format!("the worker process printed no vmhwm_kib:\n{stdout}"))?
        .parse()?;
    Ok(Rss {
        mode,
        handlers,
        jobs,
        vmhwm_kib,
    })
}

#[cfg(test)]
mod tests {
    use super::count_setting;

    #[test]
    fn a_count_setting_that_is_not_a_number_is_refused_by_name() {
        assert_eq!(count_setting("N", None).unwrap(), None);
        assert_eq!(count_setting("N", Some(String::new())).unwrap(), None);
        assert_eq!(count_setting("N", Some("2000".into())).unwrap(), Some(2000));
        let err = count_setting("BENCH_CLAIM_AHEAD", Some("2k".into())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "BENCH_CLAIM_AHEAD=2k: expected a number of jobs"
        );
    }
}
