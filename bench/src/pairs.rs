//! A dbworker burn-down and the raw-SQL floor measured right after it, on
//! the same freshly prepared table: the pairs every "÷ floor" ratio divides.

use crate::db::{self, Bench};
use crate::report::Pair;
use crate::{BenchArgs, Result, floor, framework, progress};

/// Heartbeat handling at `handlers`, then the floor right after it (so both
/// see the same machine weather), on a table with `completed` old rows.
pub(crate) async fn heartbeat_pair(
    bench: &Bench,
    args: &BenchArgs,
    handlers: usize,
    completed: u64,
) -> Result<Pair> {
    let mode = db::Mode::Heartbeat;
    bench
        .prepare(completed, args.jobs, args.enqueue_batch)
        .await?;
    let framework = framework::burn(bench, mode, handlers, args.jobs).await?;
    bench
        .prepare(completed, args.jobs, args.enqueue_batch)
        .await?;
    let floor =
        floor::heartbeat(bench, args.floor_connections, args.floor_batch, args.jobs).await?;
    let pair = Pair::new(mode, handlers, completed, framework, floor);
    progress(format_args!("{}", pair.summary()));
    Ok(pair)
}

/// Transactional handling at `handlers`, then its floor at the same concurrency.
pub(crate) async fn transactional_pair(
    bench: &Bench,
    args: &BenchArgs,
    handlers: usize,
    completed: u64,
) -> Result<Pair> {
    let mode = db::Mode::Transactional;
    let jobs = args.tx_jobs();
    bench.prepare(completed, jobs, args.enqueue_batch).await?;
    let framework = framework::burn(bench, mode, handlers, jobs).await?;
    bench.prepare(completed, jobs, args.enqueue_batch).await?;
    let floor = floor::transactional(bench, handlers, args.floor_batch, jobs).await?;
    let pair = Pair::new(mode, handlers, completed, framework, floor);
    progress(format_args!("{}", pair.summary()));
    Ok(pair)
}
