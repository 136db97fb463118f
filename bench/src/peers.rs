//! Peers: other job libraries measured in the same run, beside dbworker and the
//! floor (`--peers graphile`).
//!
//! A peer lives in a Cargo project of its own under `bench-peers/` that is not
//! a member of the workspace, so `cargo test` and CI never compile it; the
//! benchmark builds it on demand (`cargo build --release --manifest-path
//! bench-peers/<peer>/Cargo.toml`, into `<target dir>/bench-peers`, or
//! `BENCH_PEERS_TARGET_DIR`), then runs its binary as a process with
//! `--url --jobs --concurrency --mode throughput|latency [--rate]` and reads
//! one line of JSON from its stdout. The peer sets up its own schema in the
//! bench database and enqueues its jobs itself, outside the timed part.
//!
//! At each handler count: dbworker (heartbeat handling, defaults, LISTEN on),
//! the heartbeat floor, then the peer at the same concurrency; then pickup
//! latency of dbworker (NOTIFY on) and of the peer, at the same rate.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::db::{Bench, Mode, Statements};
use crate::latency::{self, Latency};
use crate::report::{Run, Table, count, met, rate, statements_per_job, wal_per_job};
use crate::{RUN_TIMEOUT, Result, floor, framework, progress};

/// The peers `--peers` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Peer {
    /// graphile_worker (Rust) from crates.io, in `bench-peers/graphile/`.
    Graphile,
}

impl Peer {
    /// Its directory under `bench-peers/`, and its binary's name.
    fn project(self) -> (&'static str, &'static str) {
        match self {
            Peer::Graphile => ("graphile", "bench-peer-graphile"),
        }
    }
}

/// What a peer prints: one JSON object per run.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PeerLine {
    pub(crate) peer: String,
    pub(crate) version: String,
    pub(crate) config: String,
    #[serde(default)]
    pub(crate) jobs_per_s: f64,
    #[serde(default)]
    p50_ms: f64,
    #[serde(default)]
    p95_ms: f64,
    #[serde(default)]
    p99_ms: f64,
    #[serde(default)]
    max_ms: f64,
    #[serde(default)]
    jobs: u64,
    /// Latency runs: jobs the peer had not started 120 s after the last
    /// insert (counted as started then).
    #[serde(default)]
    never_started: u64,
    /// The peer process's peak RSS (throughput runs), its own enqueue
    /// included.
    #[serde(default)]
    pub(crate) vmhwm_kib: u64,
}

/// One handler count: dbworker, the floor and the peer, in that order.
#[derive(Debug, Clone)]
pub(crate) struct Throughput {
    pub(crate) handlers: usize,
    pub(crate) dbworker: Run,
    pub(crate) floor: Run,
    pub(crate) peer: PeerLine,
    /// dbworker's statements and WAL, enqueue and burn-down together.
    pub(crate) ours_with_enqueue: Option<Statements>,
    /// The peer's, its whole run: enqueue, burn-down, and its set-up.
    pub(crate) peer_cost: Option<Statements>,
    /// A dbworker worker process's peak RSS burning down the same jobs at
    /// the same handlers (heartbeat handling, defaults).
    pub(crate) rss: framework::Rss,
}

/// Everything measured of one peer.
#[derive(Debug, Clone)]
pub(crate) struct PeerRuns {
    pub(crate) throughput: Vec<Throughput>,
    /// dbworker with NOTIFY on, then the peer in its batching configuration
    /// (the one compared), then without its local queue.
    pub(crate) latency: Option<(Latency, Vec<PeerLine>)>,
    /// The same from many producers at once: dbworker's many-producers run
    /// (NOTIFY on, no xmin held), then the peer's two configurations.
    pub(crate) many: Option<(Latency, Vec<PeerLine>)>,
}

/// The many-producers pickup runs beside the peer: producers, their rate in
/// all, and jobs (no run when `producers` is 0).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ManyProducers {
    pub(crate) producers: usize,
    pub(crate) rate: f64,
    pub(crate) jobs: u64,
}

/// Builds the peer's binary (cargo prints its progress on stderr); returns its path.
pub(crate) async fn build(peer: Peer) -> Result<PathBuf> {
    let (dir, bin) = peer.project();
    let root = crate::workspace_root();
    let manifest = root.join("bench-peers").join(dir).join("Cargo.toml");
    let target = match std::env::var_os("BENCH_PEERS_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), PathBuf::from)
            .join("bench-peers"),
    };
    progress(format_args!(
        "peers: building {} into {}",
        manifest.display(),
        target.display()
    ));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = tokio::process::Command::new(cargo)
        .args(["build", "--release", "--locked", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .await?;
    if !status.success() {
        return Err(format!("building {} failed ({status})", manifest.display()).into());
    }
    Ok(target.join("release").join(bin))
}

/// Runs the peer binary once and parses its line.
async fn run_peer(exe: &Path, bench: &Bench, args: &[String]) -> Result<PeerLine> {
    let output = tokio::process::Command::new(exe)
        .args(["--url", bench.url()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_TIMEOUT, output).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "peer {} failed ({}):\n{stdout}\n{}",
            exe.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("peer printed no JSON line:\n{stdout}"))?;
    Ok(serde_json::from_str(line)?)
}

/// The peers workload for one peer (see the module docs).
#[allow(clippy::too_many_arguments, reason = "the workload's knobs, once")]
pub(crate) async fn run(
    bench: &Bench,
    exe: &Path,
    handler_counts: &[usize],
    jobs: u64,
    enqueue_batch: u64,
    floor_connections: usize,
    floor_batch: usize,
    latency_jobs: u64,
    latency_rate: f64,
    many: ManyProducers,
) -> Result<PeerRuns> {
    let mut runs = PeerRuns {
        throughput: Vec::new(),
        latency: None,
        many: None,
    };
    for &handlers in handler_counts {
        bench.reset_statements().await?;
        bench.prepare(0, jobs, enqueue_batch).await?;
        let enqueued = bench.statements().await?;
        let dbworker = framework::burn_with(bench, Mode::Heartbeat, handlers, jobs, true).await?;
        let ours_with_enqueue = enqueued.zip(dbworker.statements).map(|(a, b)| a + b);
        bench.prepare(0, jobs, enqueue_batch).await?;
        let floor = floor::heartbeat(bench, floor_connections, floor_batch, jobs).await?;
        bench.reset_statements().await?;
        let peer = run_peer(
            exe,
            bench,
            &[
                "--jobs".into(),
                jobs.to_string(),
                "--concurrency".into(),
                handlers.to_string(),
                "--mode".into(),
                "throughput".into(),
            ],
        )
        .await?;
        let peer_cost = bench.statements().await?;
        let rss = framework::measure_rss(bench, Mode::Heartbeat, handlers, jobs).await?;
        progress(format_args!(
            "peers: {handlers} handlers: dbworker {:.0}, floor {:.0}, {} {:.0} jobs/s",
            dbworker.rate(),
            floor.rate(),
            peer.peer,
            peer.jobs_per_s
        ));
        runs.throughput.push(Throughput {
            handlers,
            dbworker,
            floor,
            peer,
            ours_with_enqueue,
            peer_cost,
            rss,
        });
    }
    if latency_jobs > 0 {
        let ours = latency::run(bench, latency_jobs, latency_rate, true).await?;
        let peer_runs = peer_latency(
            exe,
            bench,
            &ours,
            latency_jobs,
            latency_rate,
            1,
            latency::HANDLERS,
        )
        .await?;
        runs.latency = Some((ours, peer_runs));
        if many.producers > 0 {
            let ours =
                latency::run_many(bench, many.jobs, many.rate, many.producers, false).await?;
            let peer_runs = peer_latency(
                exe,
                bench,
                &ours,
                many.jobs,
                many.rate,
                many.producers,
                latency::MANY_HANDLERS,
            )
            .await?;
            runs.many = Some((ours, peer_runs));
        }
    }
    Ok(runs)
}

/// The peer's pickup latency at `rate` from `producers` at once: its
/// batching configuration (the comparison), then its plain fetch path
/// without the local queue (for reference).
async fn peer_latency(
    exe: &Path,
    bench: &Bench,
    ours: &Latency,
    jobs: u64,
    rate: f64,
    producers: usize,
    handlers: usize,
) -> Result<Vec<PeerLine>> {
    let mut peer_runs = Vec::new();
    for local_queue in ["on", "off"] {
        let peer = run_peer(
            exe,
            bench,
            &[
                "--jobs".into(),
                jobs.to_string(),
                "--concurrency".into(),
                handlers.to_string(),
                "--mode".into(),
                "latency".into(),
                "--rate".into(),
                rate.to_string(),
                "--producers".into(),
                producers.to_string(),
                "--local-queue".into(),
                local_queue.into(),
            ],
        )
        .await?;
        progress(format_args!(
            "peers: pickup p50/p99 ({producers} producers): dbworker {:?}/{:?}, {} ({}) {:.2}/{:.2} ms",
            ours.p50, ours.p99, peer.peer, peer.config, peer.p50_ms, peer.p99_ms
        ));
        peer_runs.push(peer);
    }
    Ok(peer_runs)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The peers' tables: throughput, then latency, with issue 17's (throughput) and issue 38's (pickup) targets.
pub(crate) fn tables(runs: &PeerRuns) -> Vec<Table> {
    let mut tables = Vec::new();
    let who = runs
        .throughput
        .first()
        .map(|t| &t.peer)
        .or(runs.latency.as_ref().and_then(|(_, p)| p.first()));
    let Some(who) = who else {
        return tables;
    };
    let name = format!("{} {}", who.peer, who.version);
    if !runs.throughput.is_empty() {
        tables.push(Table {
            title: format!(
                "Peers: no-op burn-down beside {name} ({}); dbworker: heartbeat handling, \
                 defaults, LISTEN on",
                who.config
            ),
            headers: vec![
                "handlers",
                "jobs",
                "dbworker jobs/s",
                "floor jobs/s",
                "peer jobs/s",
                "dbworker ÷ peer",
                "peer ÷ floor",
                "≥ 1.5 × peer (issue 17)",
            ],
            rows: runs
                .throughput
                .iter()
                .map(|t| {
                    let ratio = t.dbworker.rate() / t.peer.jobs_per_s.max(1e-9);
                    vec![
                        t.handlers.to_string(),
                        count(t.dbworker.jobs),
                        rate(t.dbworker.rate()),
                        rate(t.floor.rate()),
                        rate(t.peer.jobs_per_s),
                        format!("{ratio:.2}"),
                        format!("{:.2}", t.peer.jobs_per_s / t.floor.rate().max(1e-9)),
                        met(ratio >= 1.5).to_owned(),
                    ]
                })
                .collect(),
        });
    }
    if !runs.throughput.is_empty() {
        tables.push(Table {
            title: format!(
                "Peers: peak RSS (VmHWM) of a worker process burning down the same jobs; \
                 {name}'s process also enqueued them"
            ),
            headers: vec![
                "handlers",
                "jobs",
                "dbworker",
                "peer",
                "dbworker ÷ peer",
                "≤ peer (issue 38)",
            ],
            rows: runs
                .throughput
                .iter()
                .map(|t| {
                    let peer = t.peer.vmhwm_kib as f64 / 1024.0;
                    let ratio = t.rss.mib() / peer.max(1e-9);
                    vec![
                        t.handlers.to_string(),
                        count(t.rss.jobs),
                        format!("{:.1} MiB", t.rss.mib()),
                        format!("{peer:.1} MiB"),
                        format!("{ratio:.2}"),
                        met(t.peer.vmhwm_kib > 0 && ratio <= 1.0).to_owned(),
                    ]
                })
                .collect(),
        });
        tables.push(Table {
            title: format!(
                "Peers: statements (pg_stat_statements: all / without BEGIN, COMMIT, ...) and WAL \
                 bytes per job, enqueue and burn-down together; {name}'s include its schema \
                 set-up and start-up (amortized over the run)"
            ),
            headers: vec![
                "handlers",
                "jobs",
                "stmts/job dbworker",
                "stmts/job peer",
                "WAL/job dbworker",
                "WAL/job peer",
            ],
            rows: runs
                .throughput
                .iter()
                .map(|t| {
                    let jobs = t.dbworker.jobs;
                    vec![
                        t.handlers.to_string(),
                        count(jobs),
                        statements_per_job(t.ours_with_enqueue, jobs),
                        statements_per_job(t.peer_cost, jobs),
                        wal_per_job(t.ours_with_enqueue, jobs),
                        wal_per_job(t.peer_cost, jobs),
                    ]
                })
                .collect(),
        });
    }
    if let Some((ours, peer_runs)) = &runs.latency {
        tables.extend(latency_table(
            &name,
            ours,
            peer_runs,
            format!(
                "Peers: insert → handler start, {} handlers each, one insert per statement at the \
                 same rate ({name} enqueues with add_job); the target compares with the peer's \
                 first row",
                latency::HANDLERS
            ),
        ));
    }
    if let Some((ours, peer_runs)) = &runs.many {
        tables.extend(latency_table(
            &name,
            ours,
            peer_runs,
            format!(
                "Peers: insert → handler start from many producers at once, {} handlers each, \
                 one insert per statement at the same rate in all ({name}'s producers call \
                 add_job through its pool); the target compares with the peer's first row",
                latency::MANY_HANDLERS
            ),
        ));
    }
    tables
}

/// dbworker's pickup beside the peer's runs: issue 38's targets (p50 ≤ 0.75 ×
/// and p99 ≤ 1.0 × the peer's first run, no pickup above 5 × our p99).
fn latency_table(
    name: &str,
    ours: &Latency,
    peer_runs: &[PeerLine],
    title: String,
) -> Option<Table> {
    let peer = peer_runs.first()?;
    let (p50, p99) = (ms(ours.p50) / peer.p50_ms, ms(ours.p99) / peer.p99_ms);
    let tail = ms(ours.max) / ms(ours.p99).max(1e-9);
    let mut rows = vec![vec![
        "dbworker".into(),
        ours.label.clone(),
        ours.jobs.to_string(),
        format!("{:.2} ms", ms(ours.p50)),
        format!("{:.2} ms", ms(ours.p95)),
        format!("{:.2} ms", ms(ours.p99)),
        format!("{:.2} ms", ms(ours.max)),
        format!(
            "p50 {p50:.2} ×, p99 {p99:.2} ×, max {tail:.1} × own p99 \
             (p50 ≤ 0.75 ×, p99 ≤ 1.0 ×, max ≤ 5 × p99)"
        ),
        met(p50 <= 0.75 && p99 <= 1.0 && tail <= 5.0).to_owned(),
    ]];
    for p in peer_runs {
        let config = if p.never_started > 0 {
            format!(
                "{}; {} job(s) not started 120 s after the last insert (counted as started then)",
                p.config, p.never_started
            )
        } else {
            p.config.clone()
        };
        rows.push(vec![
            name.to_owned(),
            config,
            p.jobs.to_string(),
            format!("{:.2} ms", p.p50_ms),
            format!("{:.2} ms", p.p95_ms),
            format!("{:.2} ms", p.p99_ms),
            format!("{:.2} ms", p.max_ms),
            String::new(),
            String::new(),
        ]);
    }
    Some(Table {
        title,
        headers: vec![
            "who",
            "configuration",
            "jobs",
            "p50",
            "p95",
            "p99",
            "max",
            "dbworker ÷ peer (issue 38)",
            "met",
        ],
        rows,
    })
}
