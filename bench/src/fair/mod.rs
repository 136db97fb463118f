//! Fair claims (`dbworker migration --fair`, `dbworker::ddl::fair_claims_sql`)
//! beside the plain table, in one run: heartbeat burn-downs, the three
//! enqueue paths, and a claim on a large backlog with its plan. A fair table
//! tags every row it inserts waiting in a BEFORE INSERT trigger (a weight
//! look-up and a few probes of the waiting rows), and claims in tag order,
//! which leaves the claim cursor out; so the cost sits on the enqueue side
//! and in the claim's scan, and each is measured there.

mod burn;
mod claim;
mod enqueue;
mod plan;
mod profile;
mod tables;

use dbworker::JobTable;
use dbworker::ddl::{FairClaims, fair_claims_sql};
use sqlx::AssertSqlSafe;

use crate::db::{Bench, TABLE};
use crate::{Result, progress};

pub(crate) use tables::tables;

/// The workload's paragraph in the introduction of docs/benchmarks-archive.md.
pub(crate) const INTRO: &str = "- **Fair claims** (the `fair` workload, only when asked for): \
the bench table with `dbworker::ddl::fair_claims_sql` (`dbworker migration --fair`: the \
fair_key/fair_tag/fair_cost columns, the weight table, the claim's and the tagging's partial \
indexes, and the triggers that tag each row inserted or returned to waiting) beside the same \
table without it. Heartbeat burn-downs at each `--handlers` count of `--jobs` jobs over \
`--fair-keys` keys (the plain table, the fair one, then the plain one with the claim cursor \
off, which fair claims never use); single-row `enqueue`, `enqueue_many` of 100 and \
`enqueue_copy` of 10,000 from one connection, tagged into the fair table and untagged into the \
plain one, each table holding 10,000 waiting jobs first, and one COPY into a new, empty table; \
then `--fair-claims` timed claims of 10 (`Store::dequeue`, one at a time) on a \
backlog of `--fair-backlog` waiting rows over `--fair-backlog-keys` keys, the claim's plan \
(EXPLAIN of the store's own statement, read from `pg_stat_activity`), and where a tagged COPY's \
server time goes (`pg_stat_statements.track = all`, `track_functions = pl`). Every ratio is \
fair ÷ plain within the run.\n";

/// Sizes of the `fair` workload; its burn-downs use `--jobs` and `--handlers`.
#[derive(Debug, clap::Args)]
pub(crate) struct FairArgs {
    /// Keys the `fair` workload's burn-down and enqueued jobs are spread over.
    #[arg(long, default_value_t = 1_000)]
    fair_keys: u64,
    /// Waiting rows under the `fair` workload's timed claims.
    #[arg(long, default_value_t = 200_000)]
    fair_backlog: u64,
    /// Keys of that backlog.
    #[arg(long, default_value_t = 2_000)]
    fair_backlog_keys: u64,
    /// Timed claims of 10 on each backlog.
    #[arg(long, default_value_t = 1_000)]
    fair_claims: usize,
}

/// What the workload measured, every figure beside the plain table's.
#[derive(Debug)]
pub(crate) struct FairReport {
    keys: u64,
    burn_downs: Vec<burn::BurnDowns>,
    enqueues: Vec<enqueue::EnqueuePair>,
    /// The plain table's claims, then the fair table's.
    claims: Vec<claim::ClaimRun>,
    /// Where the tagging trigger's time goes, or why it was not measured.
    profile: std::result::Result<profile::Profile, String>,
}

/// Runs the workload: burn-downs at each of `handlers`, enqueues, claims on
/// the backlog, the trigger's profile; `(jobs, batch)` as the burn-downs use.
pub(crate) async fn run(
    bench: &Bench,
    args: &FairArgs,
    handlers: &[usize],
    (jobs, batch): (u64, u64),
) -> Result<FairReport> {
    let keys = args.fair_keys.max(1);
    let mut burn_downs = Vec::new();
    for &h in handlers {
        let runs = burn::at(bench, h, jobs, keys, batch).await?;
        progress(format_args!("fair: {}", runs.summary()));
        burn_downs.push(runs);
    }
    let mut enqueues = Vec::new();
    for shape in enqueue::Shape::ALL {
        let pair = enqueue::pair(bench, shape, keys).await?;
        progress(format_args!("fair: {}", pair.summary()));
        enqueues.push(pair);
    }
    let mut claims = Vec::new();
    for fair in [false, true] {
        let backlog = (args.fair_backlog, args.fair_backlog_keys.max(1));
        let run = claim::run(bench, fair, backlog, args.fair_claims.max(1), batch).await?;
        progress(format_args!("fair: {}", run.summary()));
        claims.push(run);
    }
    let profile = profile::run(bench, keys).await?;
    if let Err(why) = &profile {
        progress(format_args!(
            "fair: the trigger's profile was not measured: {why}"
        ));
    }
    drop_fair_objects(bench).await?;
    Ok(FairReport {
        keys,
        burn_downs,
        enqueues,
        claims,
        profile,
    })
}

/// Drops and creates the bench table, empty: with the fair DDL when `fair`
/// (no queue or priority column, so all jobs share one level).
async fn fresh(bench: &Bench, fair: bool) -> Result<()> {
    bench.fresh_table(0).await?;
    if fair {
        let ddl = fair_claims_sql(TABLE, &Default::default(), &FairClaims::default())?;
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(bench.admin())
            .await?;
    }
    Ok(())
}

/// A fresh table, fair or plain, with `jobs` waiting, settled as every run
/// starts: on the fair table the jobs take `keys` keys in turn, and each row
/// is tagged by the trigger (earlier rows of the same INSERT included); the
/// plain table is filled as every other workload fills it.
async fn prepare(bench: &Bench, fair: bool, jobs: u64, keys: u64, batch: u64) -> Result<()> {
    fresh(bench, fair).await?;
    if !fair {
        bench.enqueue(jobs, batch).await?;
        return bench.settle().await;
    }
    // A connection plans the trigger's statements at its first tagging and
    // keeps the plans until the table's statistics change: planned on the
    // empty table, a probe may scan it whole for every row (the enqueue into
    // a new table measures that). A first thousand rows and an ANALYZE
    // replan them before the rest.
    let first = jobs.min(1_000);
    insert_keyed(bench, 0..first, keys).await?;
    sqlx::raw_sql(AssertSqlSafe(format!("ANALYZE {TABLE}")))
        .execute(bench.admin())
        .await?;
    let mut done = first;
    while done < jobs {
        let n = (jobs - done).min(batch.max(1));
        insert_keyed(bench, done..done + n, keys).await?;
        done += n;
    }
    bench.settle().await
}

/// Inserts the jobs numbered `range`, job `g` with key `k{g % keys}`, in one
/// statement.
async fn insert_keyed(bench: &Bench, range: std::ops::Range<u64>, keys: u64) -> Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {TABLE} (queued_at, fair_key)
         SELECT now(), 'k' || (g % $3) FROM generate_series($1::bigint, $2::bigint) AS g"
    )))
    .bind(i64::try_from(range.start)?)
    .bind(i64::try_from(range.end - 1)?)
    .bind(i64::try_from(keys)?)
    .execute(bench.admin())
    .await?;
    Ok(())
}

/// The key of the `i`th job: `keys` keys in turn, named as `prepare` names them.
fn key(i: usize, keys: u64) -> String {
    format!("k{}", u64::try_from(i).unwrap_or(u64::MAX) % keys.max(1))
}

/// Refuses to measure a table that is not what the run says it is: the
/// store finds fairness by the triggers, whatever the options say.
fn expect_fair(table: &JobTable, fair: bool) -> Result<()> {
    if table.is_fair() == fair {
        return Ok(());
    }
    Err(format!(
        "fair workload: the bench table is {}fair, expected it {}",
        if table.is_fair() { "" } else { "not " },
        if fair { "fair" } else { "plain" }
    )
    .into())
}

/// Leaves no fair object behind for the workloads after this one: the
/// trigger function (with the triggers) and the weight table, which dropping
/// the job table keeps.
async fn drop_fair_objects(bench: &Bench) -> Result<()> {
    bench.fresh_table(0).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP FUNCTION IF EXISTS {TABLE}_fair_tag() CASCADE;
         DROP TABLE IF EXISTS {TABLE}_fair_weights;"
    )))
    .execute(bench.admin())
    .await?;
    Ok(())
}
