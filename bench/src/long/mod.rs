//! Long jobs' features beside the plain path, in one run (`long`, only when
//! asked for): what capturing the trace context costs an enqueue, how soon
//! a signal resumes a waiting job, and what a checkpoint costs a job that
//! works through items in chunks. Each is measured in interleaved rounds
//! (the plain variant first in even rounds, second in odd ones, so a drift
//! of the machine during the run falls on both sides alike), and every
//! ratio divides two figures of the same round.

mod attempts;
mod checkpoints;
mod signals;
mod tables;
mod traces;

use crate::db::{Bench, Mode};
use crate::{Result, progress};

pub(crate) use tables::tables;

/// Sizes of the `long` workload.
#[derive(Debug, clap::Args)]
pub(crate) struct LongArgs {
    /// Interleaved rounds of each `long` measurement (each round measures
    /// the plain variant and the feature once).
    #[arg(long, default_value_t = 3)]
    long_rounds: usize,
    /// Single `Enqueuer::enqueue` calls per variant and round, spread over
    /// `--long-enqueue-tasks` tasks.
    #[arg(long, default_value_t = 20_000)]
    long_enqueues: usize,
    /// `enqueue_many` calls of 1,000 jobs per variant and round, spread over
    /// the same tasks.
    #[arg(long, default_value_t = 200)]
    long_enqueue_many_calls: usize,
    /// Concurrent enqueuing tasks (one connection each).
    #[arg(long, default_value_t = 8)]
    long_enqueue_tasks: usize,
    /// Slices of each enqueue round: the plain and the traced table take
    /// turns, a slice each, so both see the same moments of the machine.
    #[arg(long, default_value_t = 10)]
    long_enqueue_slices: usize,
    /// Signalled jobs per round (and as many plain inserts beside them).
    #[arg(long, default_value_t = 500)]
    long_signals: usize,
    /// Signals (and plain inserts) sent per second.
    #[arg(long, default_value_t = 100.0)]
    long_signal_rate: f64,
    /// Chunks of the checkpointed job (one checkpoint after each).
    #[arg(long, default_value_t = 200)]
    long_chunks: u64,
    /// Items (rows written) per chunk.
    #[arg(long, default_value_t = 1_000)]
    long_chunk_items: u64,
    /// Jobs per table and round of the traced attempts' burn-down.
    #[arg(long, default_value_t = 20_000)]
    long_burn_jobs: u64,
    /// Handlers of that burn-down (heartbeat handling).
    #[arg(long, default_value_t = 24)]
    long_burn_handlers: usize,
}

/// Calls of the in-process context read (`traces::context_read`).
pub(crate) const CONTEXT_READS: u32 = 100_000;

/// What the workload measured, every figure beside the plain path's.
#[derive(Debug)]
pub(crate) struct LongReport {
    enqueues: Vec<traces::EnqueueRounds>,
    /// One `TraceContext::current()` inside an exported span, if valid.
    context_read: Option<std::time::Duration>,
    attempts: attempts::BurnRounds,
    signals: signals::SignalRounds,
    checkpoints: Vec<checkpoints::CheckpointRounds>,
}

/// Runs the three measurements, `--long-rounds` rounds each, and leaves a
/// plain bench table behind (no mailbox, no optional columns).
pub(crate) async fn run(bench: &Bench, args: &LongArgs) -> Result<LongReport> {
    let rounds = args.long_rounds.max(1);
    let mut enqueues = Vec::new();
    for shape in traces::Shape::ALL {
        let calls = match shape {
            traces::Shape::Single => args.long_enqueues,
            traces::Shape::Many => args.long_enqueue_many_calls,
        };
        let sizes = traces::Sizes {
            calls: calls.max(1),
            tasks: args.long_enqueue_tasks.max(1),
            slices: args.long_enqueue_slices.max(1),
        };
        enqueues.push(traces::rounds(bench, shape, sizes, rounds).await?);
    }
    let context_read = traces::context_read(CONTEXT_READS);
    let attempts = attempts::rounds(
        bench,
        args.long_burn_jobs.max(1),
        args.long_burn_handlers.max(1),
        rounds,
    )
    .await?;
    let signals = signals::rounds(
        bench,
        args.long_signals.max(1),
        args.long_signal_rate.max(0.1),
        rounds,
    )
    .await?;
    let mut checkpoints = Vec::new();
    for mode in [Mode::Heartbeat, Mode::Transactional] {
        let sizes = checkpoints::Sizes {
            chunks: args.long_chunks.max(1),
            items: args.long_chunk_items.max(1),
        };
        checkpoints.push(checkpoints::rounds(bench, mode, sizes, rounds).await?);
    }
    bench.fresh_table(0).await?;
    Ok(LongReport {
        enqueues,
        context_read,
        attempts,
        signals,
        checkpoints,
    })
}

/// Whether round `r` (from 0) measures the plain variant first: A B, B A,
/// A B, …
fn plain_first(r: usize) -> bool {
    r.is_multiple_of(2)
}

/// The median of `xs` (the mean of the middle two for an even count).
fn median(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut xs: Vec<f64> = xs.into_iter().collect();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// `a ÷ b`, three decimals (the 2 % target needs the third).
fn ratio(a: f64, b: f64) -> String {
    format!("{:.3}", a / b.max(1e-12))
}

/// A progress line of this workload.
fn say(line: std::fmt::Arguments<'_>) {
    progress(format_args!("long: {line}"));
}
