//! The cost of dependency release, beside the plain burn-down in the same run:
//! the same no-op jobs in heartbeat handling, as plain queued jobs, as wide
//! fan-ins (every upstream job's completion deletes its edge to one shared
//! dependent), as chains, and as diamonds. The release is the trigger of
//! `dbworker migration --workflows`, inside each completion's `UPDATE`.

use std::sync::Arc;

use dbworker::NewJob;
use dbworker::workflow::{Task, Workflow, Workflows};
use sqlx::AssertSqlSafe;

use crate::Result;
use crate::db::{Bench, Mode, TABLE};
use crate::framework::{self, NoOp, Progress};
use crate::report::{Run, Table};

/// The widest fan-in: one dependent waiting for this many jobs.
pub(crate) const FAN_IN_WIDTH: u64 = 10_000;
/// The end of the label of a run without the claim cursor.
const CURSOR_OFF: &str = ", claim cursor off";
/// Tasks of a chain.
const CHAIN_LENGTH: u64 = 10;

/// The shape the jobs are enqueued in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Queued jobs, no workflow: the reference.
    Plain,
    /// Fan-ins of `FAN_IN_WIDTH` upstream jobs and one dependent each.
    FanIn,
    /// Chains of `CHAIN_LENGTH` tasks, each after the one before.
    Chains,
    /// Diamonds A → (B, C) → D.
    Diamonds,
}

impl Shape {
    /// The runs, with the claim cursor on or off: a released job behind the
    /// cursor waits for its probe (`ClaimOptions::claim_cursor`, 1 s), which
    /// bounds deep graphs; off, every claim scans from the start.
    pub(crate) const RUNS: [(Shape, bool); 8] = [
        (Shape::Plain, true),
        (Shape::Plain, false),
        (Shape::FanIn, true),
        (Shape::FanIn, false),
        (Shape::Chains, true),
        (Shape::Chains, false),
        (Shape::Diamonds, true),
        (Shape::Diamonds, false),
    ];

    /// The runs to make: every one, or those `BENCH_WORKFLOW_RUNS` lists by
    /// index into [`RUNS`](Self::RUNS) (a diagnostic).
    pub(crate) fn selected() -> Vec<(Shape, bool)> {
        let only = std::env::var("BENCH_WORKFLOW_RUNS").ok();
        let wanted = |i: usize| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x.trim() == i.to_string()))
        };
        (0..Shape::RUNS.len())
            .filter(|&i| wanted(i))
            .map(|i| Shape::RUNS[i])
            .collect()
    }

    pub(crate) fn label(self, cursor: bool) -> String {
        let shape = match self {
            Shape::Plain => "plain burn-down".into(),
            Shape::FanIn => format!("fan-in: {FAN_IN_WIDTH} jobs → 1 dependent"),
            Shape::Chains => format!("chains of {CHAIN_LENGTH}"),
            Shape::Diamonds => "diamonds A → (B, C) → D".into(),
        };
        if cursor {
            shape
        } else {
            format!("{shape}{CURSOR_OFF}")
        }
    }

    /// The workflows to enqueue for about `jobs` jobs (at least one), and
    /// how many jobs that makes.
    fn workflows(self, jobs: u64) -> (Vec<Workflow>, u64) {
        let size = match self {
            Shape::Plain => return (Vec::new(), jobs),
            Shape::FanIn => FAN_IN_WIDTH.min(jobs.saturating_sub(1).max(1)) + 1,
            Shape::Chains => CHAIN_LENGTH,
            Shape::Diamonds => 4,
        };
        let count = ((jobs + size / 2) / size).max(1);
        let one = |shape: Shape| -> Workflow {
            let name = |i: u64| format!("t{i}");
            let mut w = Workflow::new();
            match shape {
                Shape::FanIn => {
                    for i in 0..size - 1 {
                        w = w.task(Task::new(name(i), NewJob::new()));
                    }
                    w = w.task(Task::new("sink", NewJob::new()).after((0..size - 1).map(name)));
                }
                Shape::Chains => {
                    w = w.task(Task::new(name(0), NewJob::new()));
                    for i in 1..size {
                        w = w.task(Task::new(name(i), NewJob::new()).after([name(i - 1)]));
                    }
                }
                _ => {
                    w = w
                        .task(Task::new("a", NewJob::new()))
                        .task(Task::new("b", NewJob::new()).after(["a"]))
                        .task(Task::new("c", NewJob::new()).after(["a"]))
                        .task(Task::new("d", NewJob::new()).after(["b", "c"]));
                }
            }
            w
        };
        ((0..count).map(|_| one(self)).collect(), count * size)
    }
}

/// A fresh table with workflows, filled in `shape`; returns its job count.
pub(crate) async fn prepare(bench: &Bench, shape: Shape, jobs: u64, batch: u64) -> Result<u64> {
    let (workflows, total) = shape.workflows(jobs);
    drop_edges(bench).await?;
    bench
        .prepare(0, if shape == Shape::Plain { jobs } else { 0 }, batch)
        .await?;
    let ddl = dbworker::ddl::workflows_sql(TABLE, &Default::default())?;
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(bench.admin())
        .await?;
    if !workflows.is_empty() {
        let mut to = dbworker::JobTableOptions::new(TABLE);
        to.workflows = true;
        let table = dbworker::JobTable::new(bench.admin(), to).await?;
        let enqueuer = Workflows::new(bench.admin(), &table).await?;
        for w in &workflows {
            enqueuer.enqueue(w).await?;
        }
    }
    // Apart: VACUUM cannot run in the transaction of a multi-statement string.
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TABLE}")))
        .execute(bench.admin())
        .await?;
    Ok(total)
}

/// Drops the edge table, whose foreign key would keep `fresh_table` from
/// dropping the job table (the workload's last step, too).
pub(crate) async fn drop_edges(bench: &Bench) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {TABLE}_deps")))
        .execute(bench.admin())
        .await?;
    Ok(())
}

/// Burns down the prepared `jobs` (released ones included) in heartbeat
/// handling with `handlers` handlers, LISTEN on.
pub(crate) async fn burn(
    bench: &Bench,
    (shape, cursor): (Shape, bool),
    handlers: usize,
    jobs: u64,
) -> Result<Run> {
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, handlers))
        .await?;
    let progress = Progress::new();
    let mut options = framework::store_options(Mode::Heartbeat);
    if !cursor {
        options.claim.claim_cursor = None;
    }
    // LISTEN on, as recommended: a release announces the released job's id,
    // and the cursor goes back for it.
    let mut worker_options = framework::worker_options(handlers, Some(jobs))?;
    crate::latency::enable_notify(&pool, &mut options, &mut worker_options).await?;
    let table = framework::job_table(&pool).await?;
    let store = Arc::new(dbworker::DbStore::new(&pool, &table, options).await?);
    let handler = NoOp {
        progress: progress.clone(),
        starts: None,
    };
    let worker = dbworker::new_worker(store, handler, worker_options)?;
    bench.reset_statements().await?;
    framework::measure(bench, &pool, &progress, jobs, &shape.label(cursor), async {
        Ok(worker.run().await)
    })
    .await
}

/// The report's table: each shape beside the plain run.
pub(crate) fn table(runs: &[(String, usize, Run)]) -> Option<Table> {
    let (_, _, plain) = runs.first()?;
    Some(Table {
        title: "Workflows, heartbeat handling: dependency release beside the plain burn-down"
            .into(),
        headers: vec![
            "shape",
            "handlers",
            "jobs",
            "jobs/s",
            "÷ plain",
            "÷ plain, same cursor",
            "stmts/job",
        ],
        rows: runs
            .iter()
            .map(|(label, handlers, run)| {
                let off = label.ends_with(CURSOR_OFF);
                let same = runs
                    .iter()
                    .find(|(l, _, _)| l.starts_with("plain") && l.ends_with(CURSOR_OFF) == off)
                    .map_or(plain, |(_, _, r)| r);
                vec![
                    label.clone(),
                    handlers.to_string(),
                    run.jobs.to_string(),
                    format!("{:.0}", run.rate()),
                    format!("{:.2}", run.rate() / plain.rate().max(1e-9)),
                    format!("{:.2}", run.rate() / same.rate().max(1e-9)),
                    run.statements_per_job(),
                ]
            })
            .collect(),
    })
}

/// The intro's paragraph on this workload.
pub(crate) const INTRO: &str = "- **Workflows** (the `workflows` workload): the plain heartbeat \
burn-down, then the same no-op jobs enqueued as workflows on a table with `dbworker migration \
--workflows`: fan-ins of 10,000 jobs releasing one shared dependent each, chains of 10, and \
diamonds A → (B, C) → D, each burned down by the same worker (released jobs included); the \
ratio is to the plain run (and to the plain run with the same claim-cursor setting). Each \
shape runs twice: with the claim cursor (a released job behind it waits for its probe, up to 1 s, \
so a graph's rate measures that latency too) and without it (every claim scans from the start). \
The release runs in the trigger inside each completion's `UPDATE`, \
so it adds no top-level statement: the stmts/job column shows none, and its cost shows in jobs/s.\n";
