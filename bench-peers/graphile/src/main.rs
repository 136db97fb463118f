//! graphile_worker (Rust), run by dbworker's benchmark as a peer (`--peers graphile`).
//!
//! ```sh
//! bench-peer-graphile --url URL --jobs N --concurrency C --mode throughput
//! bench-peer-graphile --url URL --jobs N --concurrency C --mode latency --rate R [--producers P]
//! ```
//!
//! Each run drops the `graphile_worker` schema of the bench database and lets the
//! crate migrate it again, so every run starts from an empty, fresh schema. It
//! prints one line of JSON on stdout; progress goes to stderr.
//!
//! - `throughput`: enqueues N no-op jobs with `add_jobs` (5,000 per call),
//!   VACUUM ANALYZE, then starts the worker with concurrency C and measures from
//!   `run()` to the moment the jobs table is seen empty (graphile_worker deletes a
//!   job when its completion is written), as the benchmark measures dbworker from
//!   the worker's start to its last recorded outcome.
//! - `latency`: starts the worker (concurrency C), waits 500 ms, then calls
//!   `add_job` once per tick at R per second; the clock is read just before each
//!   call and again on the handler's first line, matched by job id (as
//!   `bench/src/latency.rs` measures dbworker). With `--producers P`, P tasks
//!   call it at once, each at R / P per second, spread over the first period.
//!
//! The configuration is the crate's own advice for many small jobs, tuned to
//! be the fastest we found: a local queue (docs/src/guides/local-queue.md) of
//! 1,000 jobs × 4 queues (`queue_count` > 1 is the guide's advice for very
//! small, high-volume jobs), 60 s TTL; completion and failure batching with a
//! 5 ms delay and a 500 ms poll interval (the "throughput-oriented worker" of
//! docs/src/configuration/worker-options.md); LISTEN/NOTIFY delivery on (its
//! default); the crate's default pool of 20 connections. Of the variants tried
//! on this machine (local queue 100, 1,000 or 5,000 jobs, 1 or 4 queues, 5 or
//! 500 ms poll interval, pool 20 or 100) it was the fastest at concurrency 24
//! and 100; the documented example's 100 × 1 ran at about 0.4 × of it. The
//! Without the local queue (`--local-queue off`) a full queue drained here at
//! about C jobs per poll interval (the worker waited for the next poll after
//! each round), so that variant is run for pickup latency only. The
//! knobs stay available as flags (`--local-queue on|off`, `--local-queue-size`,
//! `--queue-count`, `--pool`, `--poll-ms`) for such comparisons.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, Worker, WorkerContext,
    WorkerOptions,
};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The crate version this peer is pinned to (Cargo.toml and Cargo.lock agree).
const VERSION: &str = "0.14.1";
/// graphile_worker's default pool size (`max_pg_conn`).
const POOL: u32 = 20;
const LOCAL_QUEUE_SIZE: usize = 1_000;
const QUEUE_COUNT: usize = 4;
const LOCAL_QUEUE_TTL: Duration = Duration::from_secs(60);
const BATCH_DELAY: Duration = Duration::from_millis(5);
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Jobs per `add_jobs` call when enqueueing the burn-down.
const ENQUEUE_BATCH: usize = 5_000;

/// The configuration, stated in the result.
fn config(args: &Args) -> String {
    let queue = if args.local_queue {
        format!(
            "local_queue(size {}, queue_count {}, ttl {} s)",
            args.size,
            args.queue_count,
            LOCAL_QUEUE_TTL.as_secs()
        )
    } else {
        "no local queue".to_owned()
    };
    format!(
        "{queue}, complete/fail_job_batch_delay {} ms, poll_interval {} ms, \
         NOTIFY delivery on, pool {}",
        BATCH_DELAY.as_millis(),
        args.poll.as_millis(),
        args.pool
    )
}

/// A no-op job: counts itself and, in latency runs, records when it started.
#[derive(Clone, Serialize, Deserialize)]
struct NoOp {}

/// Handlers that ran.
#[derive(Clone, Debug, Default)]
struct Ran(Arc<AtomicU64>);

/// When each handler started, by job id (latency runs).
#[derive(Clone, Debug, Default)]
struct Starts(Arc<Mutex<HashMap<i64, Instant>>>);

impl TaskHandler for NoOp {
    const IDENTIFIER: &'static str = "bench_noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(starts) = ctx.get_ext::<Starts>() {
            let now = Instant::now();
            starts
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(*ctx.job().id(), now);
        }
        if let Some(ran) = ctx.get_ext::<Ran>() {
            ran.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<(), String>(())
    }
}

#[derive(Debug, PartialEq)]
enum Mode {
    Throughput,
    Latency,
}

#[derive(Debug)]
struct Args {
    url: String,
    jobs: u64,
    concurrency: usize,
    mode: Mode,
    rate: f64,
    /// Concurrent producers of the latency run, sharing `rate` (each calls
    /// `add_job` through the worker's pool).
    producers: usize,
    /// Whether the local queue is on (the documented throughput configuration).
    local_queue: bool,
    /// Experiment knobs (defaults: the configuration stated in the crate docs).
    size: usize,
    queue_count: usize,
    pool: u32,
    poll: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        url: String::new(),
        jobs: 0,
        concurrency: 0,
        mode: Mode::Throughput,
        rate: 50.0,
        producers: 1,
        local_queue: true,
        size: LOCAL_QUEUE_SIZE,
        queue_count: QUEUE_COUNT,
        pool: POOL,
        poll: POLL_INTERVAL,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => args.url = value,
            "--jobs" => args.jobs = value.parse()?,
            "--concurrency" => args.concurrency = value.parse()?,
            "--rate" => args.rate = value.parse()?,
            "--producers" => args.producers = value.parse::<usize>()?.max(1),
            "--local-queue" => args.local_queue = value == "on",
            "--local-queue-size" => args.size = value.parse()?,
            "--queue-count" => args.queue_count = value.parse()?,
            "--pool" => args.pool = value.parse()?,
            "--poll-ms" => args.poll = Duration::from_millis(value.parse()?),
            "--mode" => {
                args.mode = match value.as_str() {
                    "throughput" => Mode::Throughput,
                    "latency" => Mode::Latency,
                    other => return Err(format!("unknown mode {other}").into()),
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if args.url.is_empty() || args.jobs == 0 || args.concurrency == 0 {
        return Err("--url, --jobs and --concurrency are required (jobs, concurrency ≥ 1)".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    // A fresh schema per run, like the fresh table of every dbworker run.
    let mut conn = PgConnection::connect(&args.url).await?;
    sqlx::raw_sql("DROP SCHEMA IF EXISTS graphile_worker CASCADE")
        .execute(&mut conn)
        .await?;
    let line = match args.mode {
        Mode::Throughput => throughput(&args, &mut conn).await?,
        Mode::Latency => latency(&args).await?,
    };
    conn.close().await?;
    println!("{line}");
    Ok(())
}

/// The worker in the peer's throughput configuration, migrated.
async fn worker(args: &Args, ran: Ran, starts: Starts) -> Result<Worker> {
    let options = WorkerOptions::default()
        .database_url(&args.url)
        .max_pg_conn(args.pool)
        .concurrency(args.concurrency)
        .poll_interval(args.poll)
        .complete_job_batch_delay(BATCH_DELAY)
        .fail_job_batch_delay(BATCH_DELAY)
        .add_extension(ran)
        .add_extension(starts)
        .define_job::<NoOp>();
    let options = if args.local_queue {
        options.local_queue(
            LocalQueueConfig::default()
                .with_size(args.size)
                .with_queue_count(args.queue_count)
                .with_ttl(LOCAL_QUEUE_TTL),
        )
    } else {
        options
    };
    Ok(options.init().await?)
}

async fn throughput(args: &Args, conn: &mut PgConnection) -> Result<String> {
    let ran = Ran::default();
    let worker = Arc::new(worker(args, ran.clone(), Starts::default()).await?);
    let utils = worker.create_utils();
    let spec = JobSpec::default();
    let mut left = args.jobs;
    while left > 0 {
        let n = left.min(ENQUEUE_BATCH as u64);
        let batch: Vec<(NoOp, &JobSpec)> = (0..n).map(|_| (NoOp {}, &spec)).collect();
        utils.add_jobs::<NoOp>(&batch).await?;
        left -= n;
    }
    sqlx::raw_sql("VACUUM ANALYZE graphile_worker._private_jobs")
        .execute(&mut *conn)
        .await?;
    eprintln!("graphile peer: {} jobs queued", args.jobs);

    let start = Instant::now();
    let running = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run().await })
    };
    while ran.0.load(Ordering::Relaxed) < args.jobs {
        if running.is_finished() {
            return Err("the worker stopped before the jobs ran".into());
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err("timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Every handler ran; the completions are written in batches. A query whose
    // snapshot sees no row started after the last completion committed.
    let elapsed = loop {
        let sent = start.elapsed();
        let left: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT FROM graphile_worker._private_jobs)")
                .fetch_one(&mut *conn)
                .await?;
        if !left {
            break sent;
        }
        if sent > Duration::from_secs(600) {
            return Err("completions never written".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    worker.request_shutdown();
    running.await??;
    let ran = ran.0.load(Ordering::Relaxed);
    if ran != args.jobs {
        return Err(format!("{ran} handlers ran for {} jobs", args.jobs).into());
    }
    let seconds = elapsed.as_secs_f64();
    Ok(serde_json::json!({
        "peer": "graphile_worker",
        "version": VERSION,
        "mode": "throughput",
        "config": config(args),
        "concurrency": args.concurrency,
        "jobs": args.jobs,
        "seconds": seconds,
        "jobs_per_s": args.jobs as f64 / seconds.max(1e-9),
        "vmhwm_kib": vmhwm_kib(),
    })
    .to_string())
}

async fn latency(args: &Args) -> Result<String> {
    let starts = Starts::default();
    let worker = Arc::new(worker(args, Ran::default(), starts.clone()).await?);
    let utils = worker.create_utils();
    let running = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run().await })
    };
    // Let the worker reach its idle loop first.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Each producer inserts at its share of the rate, the producers spread
    // over the first period so that their inserts interleave (as
    // bench/src/latency.rs's many-producers runs do).
    let producers = args.producers;
    let each_rate = args.rate.max(0.1) / producers as f64;
    let mut tasks = Vec::with_capacity(producers);
    for i in 0..producers as u64 {
        let n = args.jobs / producers as u64 + u64::from(i < args.jobs % producers as u64);
        let offset = Duration::from_secs_f64(i as f64 / args.rate.max(0.1));
        let utils = utils.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / each_rate));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = HashMap::new();
            for _ in 0..n {
                ticks.tick().await;
                let t0 = Instant::now();
                let job = utils.add_job(NoOp {}, JobSpec::default()).await?;
                sent.insert(*job.id(), t0);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(sent)
        }));
    }
    let mut sent = HashMap::new();
    for task in tasks {
        sent.extend(task.await??);
    }
    // A job not started by the deadline counts as started then (a lower
    // bound on its pickup), and the line says how many there were.
    let deadline = Instant::now() + Duration::from_secs(120);
    while lock(&starts).len() < sent.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.request_shutdown();
    running.await??;

    let starts = lock(&starts);
    let mut waits = Vec::with_capacity(sent.len());
    let mut never_started = 0u64;
    for (id, t0) in &sent {
        let t1 = starts.get(id).copied().unwrap_or_else(|| {
            never_started += 1;
            deadline
        });
        waits.push(t1.saturating_duration_since(*t0));
    }
    if never_started > 0 {
        eprintln!("{never_started} job(s) never started within 120 s of the last insert");
    }
    waits.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(serde_json::json!({
        "peer": "graphile_worker",
        "version": VERSION,
        "mode": "latency",
        "config": config(args),
        "concurrency": args.concurrency,
        "rate": args.rate,
        "producers": args.producers,
        "never_started": never_started,
        "jobs": waits.len(),
        "p50_ms": ms(percentile(&waits, 50)),
        "p95_ms": ms(percentile(&waits, 95)),
        "p99_ms": ms(percentile(&waits, 99)),
        "max_ms": ms(waits.last().copied().unwrap_or_default()),
    })
    .to_string())
}

fn lock(starts: &Starts) -> std::sync::MutexGuard<'_, HashMap<i64, Instant>> {
    starts.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Nearest-rank percentile `p` (in %) of sorted values (as the benchmark's).
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100);
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// This process's peak RSS (VmHWM, in KiB), as dbworker's bench worker
/// reports its own; 0 where /proc is not readable.
fn vmhwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0)
}
