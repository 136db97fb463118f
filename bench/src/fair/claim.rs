//! The claim on a large backlog: `Store::dequeue` of 10 rows, one at a time
//! on one connection (each a statement and its commit), on the plain table
//! and on the fair one; the latency as the caller sees it, the server's
//! execution time from `pg_stat_statements`, and the plan of the statement.

use std::time::{Duration, Instant};

use dbworker::DbStore;
use workerutil::Store;

use super::plan::{self, Plans};
use crate::Result;
use crate::db::{Bench, Mode, Statements};
use crate::framework::{self, BenchJob};
use crate::latency::percentile;
use crate::report::count;
use crate::table::ms;

/// Rows per claim.
pub(crate) const CLAIM_SIZE: usize = 10;
/// Untimed claims first: the connection, its prepared statement (past the
/// five custom plans after which Postgres may settle on a generic one).
const WARM_UP: usize = 10;

/// The timed claims on one table.
#[derive(Debug)]
pub(crate) struct ClaimRun {
    pub(crate) fair: bool,
    pub(crate) backlog: u64,
    pub(crate) keys: u64,
    pub(crate) claims: usize,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    /// The claim statement's mean and max execution time on the server.
    pub(crate) server: Option<(Duration, Duration)>,
    pub(crate) statements: Option<Statements>,
    /// The claim's plans, or why they could not be read.
    pub(crate) plans: std::result::Result<Plans, String>,
}

impl ClaimRun {
    pub(crate) fn table_name(&self) -> &'static str {
        if self.fair { "fair" } else { "plain" }
    }

    pub(crate) fn summary(&self) -> String {
        format!(
            "claims of {CLAIM_SIZE} on {} waiting rows, {} table: p50 {}, p99 {}, max {}",
            count(self.backlog),
            self.table_name(),
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// `claims` timed claims on a fresh table of `backlog` waiting rows (over
/// `keys` keys when `fair`).
pub(crate) async fn run(
    bench: &Bench,
    fair: bool,
    (backlog, keys): (u64, u64),
    claims: usize,
    batch: u64,
) -> Result<ClaimRun> {
    let needed = u64::try_from((claims + WARM_UP + 1) * CLAIM_SIZE)?;
    if backlog < needed {
        return Err(format!("--fair-backlog must be at least {needed} for {claims} claims").into());
    }
    super::prepare(bench, fair, backlog, keys, batch).await?;
    // One connection: the claim is then its backend's last statement.
    let pool = bench.pool(1).await?;
    let table = framework::job_table(&pool).await?;
    super::expect_fair(&table, fair)?;
    let store =
        DbStore::<BenchJob>::new(&pool, &table, framework::store_options(Mode::Heartbeat)).await?;
    let conditions = Default::default();
    for _ in 0..WARM_UP {
        store.dequeue("bench", &conditions, CLAIM_SIZE).await?;
    }
    bench.reset_statements().await?;
    let mut took = Vec::with_capacity(claims);
    for _ in 0..claims {
        let started = Instant::now();
        let jobs = store.dequeue("bench", &conditions, CLAIM_SIZE).await?;
        took.push(started.elapsed());
        if jobs.len() != CLAIM_SIZE {
            return Err(format!("a claim of {CLAIM_SIZE} took {} rows", jobs.len()).into());
        }
    }
    let statements = bench.statements().await?;
    let server = server_times(bench).await?;
    // The plain store's cursor probe shares the connection once a second:
    // if it ran last, one more claim puts the claim back.
    let mut text = plan::claim_text(bench).await?;
    if text.is_none() {
        store.dequeue("bench", &conditions, CLAIM_SIZE).await?;
        text = plan::claim_text(bench).await?;
    }
    store.close().await;
    pool.close().await;
    let plans = match text {
        Some(Ok(sql)) => Ok(plan::explain(bench, &sql).await?),
        Some(Err(why)) => Err(why),
        None => Err("the claim was not the connection's last statement".to_owned()),
    };
    took.sort_unstable();
    Ok(ClaimRun {
        fair,
        backlog,
        keys,
        claims,
        p50: percentile(&took, 50),
        p99: percentile(&took, 99),
        max: took.last().copied().unwrap_or_default(),
        server,
        statements,
        plans,
    })
}

/// The claim's mean and max execution time since the last reset, from
/// `pg_stat_statements` (the most called statement with `SKIP LOCKED`).
async fn server_times(bench: &Bench) -> Result<Option<(Duration, Duration)>> {
    if bench.statements_unavailable().is_some() {
        return Ok(None);
    }
    let row: Option<(f64, f64)> = sqlx::query_as(
        r"SELECT mean_exec_time, max_exec_time FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query ILIKE '%SKIP LOCKED%' AND query NOT ILIKE '%pg_stat_statements%'
          ORDER BY calls DESC LIMIT 1",
    )
    .fetch_optional(bench.admin())
    .await?;
    let millis = |x: f64| Duration::from_secs_f64(x.max(0.0) / 1000.0);
    Ok(row.map(|(mean, max)| (millis(mean), millis(max))))
}
