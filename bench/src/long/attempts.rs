//! Traced attempts: a heartbeat burn-down of jobs enqueued inside a span on
//! the table with traces, beside the same burn-down of the plain table, both
//! worked under the same exporting subscriber (every attempt makes its `job`
//! span either way). What the traced side pays beyond the plain one is what
//! a trace context costs an attempt: reading it with the claim, linking the
//! span, recording the span before the handler starts (a beat shared by the
//! attempts starting together) and with the mark.
//!
//! The worker runs on a runtime of its own whose threads have the exporting
//! subscriber as their default: the job tasks the worker spawns make their
//! spans there, as in an application that set a global subscriber.

use std::time::Duration;

use dbworker::{Enqueuer, JobTable, JobTableOptions, NewJob};
use sqlx::AssertSqlSafe;
use tracing::Instrument as _;
use tracing::instrument::WithSubscriber as _;

use super::traces::{Dropped, TRACED, exporting, fresh, traced_options};
use super::{plain_first, say};
use crate::Result;
use crate::db::{Bench, Mode, Statements, TABLE};
use crate::framework;
use crate::report::rate;

/// One side's burn-down.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Burn {
    pub(crate) jobs: u64,
    pub(crate) elapsed: Duration,
    pub(crate) statements: Option<Statements>,
}

impl Burn {
    pub(crate) fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Statements per job, every one and without utility statements.
    pub(crate) fn statements_per_job(&self) -> Option<(f64, f64)> {
        let s = self.statements?;
        let jobs = self.jobs.max(1) as f64;
        Some((s.all as f64 / jobs, s.non_utility as f64 / jobs))
    }
}

/// One round: both tables burned down, the plain one first when it says.
#[derive(Debug)]
pub(crate) struct BurnRound {
    pub(crate) plain_first: bool,
    pub(crate) plain: Burn,
    pub(crate) traced: Burn,
}

impl BurnRound {
    /// Traced jobs/s ÷ plain jobs/s.
    pub(crate) fn ratio(&self) -> f64 {
        self.traced.rate() / self.plain.rate().max(1e-9)
    }
}

/// The rounds, with the handlers they ran with.
#[derive(Debug)]
pub(crate) struct BurnRounds {
    pub(crate) handlers: usize,
    pub(crate) rounds: Vec<BurnRound>,
}

/// `rounds` interleaved rounds of `jobs` jobs on each table.
pub(crate) async fn rounds(
    bench: &Bench,
    jobs: u64,
    handlers: usize,
    rounds: usize,
) -> Result<BurnRounds> {
    let mut out = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let round = round(bench, jobs, handlers, plain_first(r)).await?;
        say(format_args!(
            "traced attempts, round {}: plain {} jobs/s, traced {} jobs/s, traced ÷ plain {:.3}",
            r + 1,
            rate(round.plain.rate()),
            rate(round.traced.rate()),
            round.ratio()
        ));
        out.push(round);
    }
    Ok(BurnRounds {
        handlers,
        rounds: out,
    })
}

async fn round(bench: &Bench, jobs: u64, handlers: usize, plain_first: bool) -> Result<BurnRound> {
    fresh(bench).await?;
    bench.enqueue(jobs, 1_000).await?;
    enqueue_traced(bench, jobs).await?;
    bench.settle().await?;
    let plain_options = framework::table_options();
    let (plain, traced) = if plain_first {
        let plain = burn(bench, plain_options, TABLE, jobs, handlers)?;
        (
            plain,
            burn(bench, traced_options(), TRACED, jobs, handlers)?,
        )
    } else {
        let traced = burn(bench, traced_options(), TRACED, jobs, handlers)?;
        (burn(bench, plain_options, TABLE, jobs, handlers)?, traced)
    };
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {TRACED}")))
        .execute(bench.admin())
        .await?;
    Ok(BurnRound {
        plain_first,
        plain,
        traced,
    })
}

/// `jobs` empty jobs on the traced table, each call's from a span of its own.
async fn enqueue_traced(bench: &Bench, jobs: u64) -> Result<()> {
    let dropped = Dropped::default();
    let (provider, dispatch) = exporting(&dropped);
    let pool = bench.pool(2).await?;
    let table = JobTable::new(&pool, traced_options()).await?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;
    let mut left = jobs;
    while left > 0 {
        let n = left.min(1_000);
        left -= n;
        let batch: Vec<NewJob> = (0..n).map(|_| NewJob::new()).collect();
        // The span is made inside, under the exporting subscriber.
        let enqueuer = &enqueuer;
        let work = async move {
            let span = tracing::info_span!("producer");
            enqueuer.enqueue_many(batch).instrument(span).await
        };
        work.with_subscriber(dispatch.clone()).await?;
    }
    pool.close().await;
    provider.shutdown()?;
    let untraced: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE traceparent IS NULL) FROM {TRACED}"
    )))
    .fetch_one(bench.admin())
    .await?;
    if untraced > 0 {
        return Err(format!("long: {untraced} traced jobs stored no trace context").into());
    }
    Ok(())
}

/// Burns down `table` on a runtime whose threads export every span.
fn burn(
    bench: &Bench,
    options: JobTableOptions,
    table: &str,
    jobs: u64,
    handlers: usize,
) -> Result<Burn> {
    let dropped = Dropped::default();
    let (provider, dispatch) = exporting(&dropped);
    // Built, run and shut down on a thread of its own: a runtime cannot be
    // dropped from inside the bench's.
    let burned = std::thread::scope(|s| {
        s.spawn(|| -> Result<Burn> {
            let thread_dispatch = dispatch.clone();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .on_thread_start(move || {
                    // The runtime's threads end with it, and their default with them.
                    std::mem::forget(tracing::dispatcher::set_default(&thread_dispatch));
                })
                .build()?;
            let _default = tracing::dispatcher::set_default(&dispatch);
            let burned = runtime.block_on(run(bench, options, jobs, handlers));
            runtime.shutdown_timeout(Duration::from_secs(5));
            burned
        })
        .join()
    })
    .map_err(|_| "long: the traced burn-down panicked")??;
    provider.shutdown()?;
    let exported = dropped.0.load(std::sync::atomic::Ordering::Relaxed);
    if exported < jobs {
        return Err(format!("long: {table}: {exported} spans exported for {jobs} jobs").into());
    }
    Ok(burned)
}

async fn run(bench: &Bench, options: JobTableOptions, jobs: u64, handlers: usize) -> Result<Burn> {
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, handlers))
        .await?;
    let table = JobTable::new(&pool, options).await?;
    let (worker, progress) = framework::noop_worker(
        &pool,
        &table,
        framework::store_options(Mode::Heartbeat),
        framework::worker_options(handlers, Some(jobs))?,
    )
    .await?;
    bench.reset_statements().await?;
    let summary = worker.run().await;
    let elapsed = progress.elapsed();
    let statements = bench.statements().await?;
    pool.close().await;
    if summary.dequeued != jobs || progress.done() != jobs {
        return Err(format!(
            "long: traced attempts: dequeued {} and finished {} of {jobs} jobs",
            summary.dequeued,
            progress.done()
        )
        .into());
    }
    Ok(Burn {
        jobs,
        elapsed,
        statements,
    })
}
