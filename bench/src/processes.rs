//! Several worker processes sharing one queue: each is this benchmark binary
//! run as `worker` until SIGTERM (heartbeat handling, or as `pooler.rs`
//! asks: either mode, through a transaction pooler); throughput is measured
//! on the database clock, from the first claim to the last completion.

use std::time::{Duration, Instant};

use crate::Result;
use crate::db::{Bench, Mode, TABLE};
use crate::framework::pool_size;
use crate::report::Run;

/// How the worker processes reach the database.
pub(crate) struct Spawn<'a> {
    /// Their connection string.
    pub(crate) url: &'a str,
    pub(crate) mode: Mode,
    /// Behind a transaction pooler (`Pooler::Transaction`).
    pub(crate) pooler: bool,
    /// The connections of all the processes' pools together, shared out
    /// evenly; default: each process as many as its handlers need.
    pub(crate) connections: Option<u32>,
}

/// Burns down `jobs` queued jobs with `processes` worker processes of
/// `handlers` handlers each, in heartbeat handling on direct connections.
pub(crate) async fn run(
    bench: &Bench,
    processes: usize,
    handlers: usize,
    jobs: u64,
    batch: u64,
) -> Result<Run> {
    let spawn = Spawn {
        url: bench.url(),
        mode: Mode::Heartbeat,
        pooler: false,
        connections: None,
    };
    run_as(bench, &spawn, processes, handlers, jobs, batch).await
}

/// [`run`] with the processes started as `spawn` says.
pub(crate) async fn run_as(
    bench: &Bench,
    spawn: &Spawn<'_>,
    processes: usize,
    handlers: usize,
    jobs: u64,
    batch: u64,
) -> Result<Run> {
    bench.prepare(0, jobs, batch).await?;
    let me = std::env::current_exe()?;
    let mut children = Vec::with_capacity(processes);
    let n = u32::try_from(processes.max(1)).unwrap_or(u32::MAX);
    let share = |i: u32| {
        spawn
            .connections
            .map(|all| (all / n + u32::from(i < all % n)).max(1))
    };
    for i in 0..n {
        children.push(
            tokio::process::Command::new(&me)
                .args([
                    "worker",
                    "--url",
                    spawn.url,
                    "--mode",
                    &spawn.mode.to_string(),
                ])
                .args(["--handlers", &handlers.to_string()])
                .args(spawn.pooler.then_some("--pooler"))
                .args(share(i).map(|c| format!("--connections={c}")))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        let (completed, first, last): (i64, Option<f64>, Option<f64>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE state = 'completed'), \
                    EXTRACT(EPOCH FROM min(started_at))::float8, EXTRACT(EPOCH FROM max(finished_at))::float8 \
             FROM {TABLE}"
        )))
        .fetch_one(bench.admin())
        .await?;
        // A process that failed (a pool too small, say) would leave the
        // others to finish its share: the run would measure fewer processes
        // than it says. Checked after the last count too: a burn-down can be
        // shorter than one poll.
        for (i, child) in children.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                return Err(format!(
                    "worker process {i} of {processes} exited ({status}) before the burn-down ended, {completed} of {jobs} jobs completed"
                )
                .into());
            }
        }
        if u64::try_from(completed).unwrap_or(0) >= jobs {
            break (first.unwrap_or(0.0), last.unwrap_or(0.0));
        }
        if Instant::now() > deadline {
            return Err(
                format!("{processes} processes completed {completed} of {jobs} jobs").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for child in &children {
        if let Some(pid) = child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
    }
    for mut child in children {
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    let (first, last) = done;
    Ok(Run {
        jobs,
        elapsed: Duration::from_secs_f64((last - first).max(1e-6)),
        per_second: Vec::new(),
        statements: None,
        connections: spawn
            .connections
            .unwrap_or_else(|| n * pool_size(spawn.mode, handlers)),
    })
}
