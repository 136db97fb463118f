//! Heartbeat burn-downs of the same jobs on the plain table and on the fair
//! one. The fair claim orders by tag, so the store leaves the claim cursor
//! out (it needs id order) and every claim walks the claim index from the
//! head; the plain table's run with the cursor off tells that part of the
//! cost from the tag order's own.

use crate::Result;
use crate::db::{Bench, Mode};
use crate::framework;
use crate::report::{Run, rate};

/// What a burn-down runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The plain table, the store's defaults (claim cursor on).
    Plain,
    /// The fair table: tag order, no cursor.
    Fair,
    /// The plain table with the claim cursor off, as the fair claim runs.
    PlainNoCursor,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Plain => "fair workload: plain table",
            Variant::Fair => "fair workload: fair table",
            Variant::PlainNoCursor => "fair workload: plain table, claim cursor off",
        }
    }
}

/// The three burn-downs at one handler count.
#[derive(Debug)]
pub(crate) struct BurnDowns {
    pub(crate) handlers: usize,
    pub(crate) plain: Run,
    pub(crate) fair: Run,
    pub(crate) no_cursor: Run,
}

impl BurnDowns {
    /// One progress line.
    pub(crate) fn summary(&self) -> String {
        format!(
            "heartbeat {} handlers: plain {}, fair {}, plain without cursor {} jobs/s; fair ÷ plain {:.2}",
            self.handlers,
            rate(self.plain.rate()),
            rate(self.fair.rate()),
            rate(self.no_cursor.rate()),
            self.fair.rate() / self.plain.rate().max(1e-9)
        )
    }
}

/// The plain run, the fair run, then the plain run without the cursor, each
/// on a fresh table of `jobs` jobs (over `keys` keys on the fair one): fair
/// between the two plain runs, so drift over the three shows as a gap
/// between those two.
pub(crate) async fn at(
    bench: &Bench,
    handlers: usize,
    jobs: u64,
    keys: u64,
    batch: u64,
) -> Result<BurnDowns> {
    let mut runs = Vec::new();
    for variant in [Variant::Plain, Variant::Fair, Variant::PlainNoCursor] {
        super::prepare(bench, variant == Variant::Fair, jobs, keys, batch).await?;
        runs.push(burn(bench, variant, handlers, jobs).await?);
    }
    let [plain, fair, no_cursor] = <[Run; 3]>::try_from(runs).map_err(|_| "three runs")?;
    Ok(BurnDowns {
        handlers,
        plain,
        fair,
        no_cursor,
    })
}

/// Burns down the prepared `jobs` with `handlers` handlers, as
/// `framework::burn` does, with the cursor off for `PlainNoCursor`.
async fn burn(bench: &Bench, variant: Variant, handlers: usize, jobs: u64) -> Result<Run> {
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, handlers))
        .await?;
    let mut options = framework::store_options(Mode::Heartbeat);
    if variant == Variant::PlainNoCursor {
        options.claim.claim_cursor = None;
    }
    let table = framework::job_table(&pool).await?;
    super::expect_fair(&table, variant == Variant::Fair)?;
    let worker_options = framework::worker_options(handlers, Some(jobs))?;
    let (worker, progress) = framework::noop_worker(&pool, &table, options, worker_options).await?;
    bench.reset_statements().await?;
    framework::measure(bench, &pool, &progress, jobs, variant.label(), async {
        Ok(worker.run().await)
    })
    .await
}
