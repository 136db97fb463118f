//! Partitioned job tables (`dbworker migration --partitioned`): the heartbeat
//! burn-down on the plain table, on a table partitioned by day with the jobs
//! spread over ten partitions, and on that table again while a purger drops
//! old partitions of finished rows beside it, once a second. Every fenced
//! statement finds its row by `id` alone there, probing each partition's
//! primary key, so the ten-partition run prices that too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::ddl::{PartitionInterval, partitioned_job_table_sql};
use dbworker::maintenance::{PurgeOptions, Purger};
use dbworker::{JobTable, JobTableOptions};
use sqlx::AssertSqlSafe;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use workerutil::JobState;

use crate::Result;
use crate::db::{Bench, Mode, TABLE};
use crate::report::{Run, Table, count, rate};

/// Partitions holding the queued jobs (one a day, back from today).
const LIVE_PARTITIONS: u64 = 10;
/// Older partitions of finished rows, dropped during the third run.
const OLD_PARTITIONS: u64 = 5;

/// The workload's paragraph in the introduction of docs/benchmarks.md.
pub(crate) const INTRO: &str = "- **Partitioned job tables** (the `partitioned` workload): the \
heartbeat burn-down on the plain table, then on a table from `dbworker migration --partitioned` \
(by day of `queued_at`) with the same number of jobs spread over ten daily partitions, then \
there again with 100,000 finished rows (`--partition-old-rows`) in five older partitions and a \
`Purger` pass every second beside the workers: its first pass detaches and drops those five \
partitions (each in a transaction that holds the job table's lock while it re-counts the \
partition), the later ones find nothing to drop after looking for a row to keep in each closed \
partition of live jobs (stopping at the first). The ratio is to the plain run; the slowest second and the jobs/s series show whether \
the drops stall the claims.\n";

/// One run of the workload.
#[derive(Debug, Clone)]
pub(crate) struct PartitionRun {
    pub(crate) label: &'static str,
    pub(crate) handlers: usize,
    pub(crate) run: Run,
    /// The purger's passes during the run: `(start offset, took, partitions dropped)`.
    pub(crate) passes: Vec<(Duration, Duration, usize)>,
}

/// A partitioned job table named like the plain one: the jobs over the last
/// ten days' partitions, and `old_rows` finished rows over five older ones.
async fn prepare(bench: &Bench, jobs: u64, old_rows: u64, batch: u64) -> Result<()> {
    let ddl = partitioned_job_table_sql(TABLE, &Default::default(), PartitionInterval::Day)?;
    let days_back = LIVE_PARTITIONS + OLD_PARTITIONS - 1;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {TABLE} CASCADE;\n{ddl}\n\
         SELECT {TABLE}_create_partitions(3, now() - interval '{days_back} days');"
    )))
    .execute(bench.admin())
    .await?;
    let mut done = 0;
    while done < jobs {
        let n = (jobs - done).min(batch.max(1));
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {TABLE} (queued_at)
             SELECT now() - (g % {LIVE_PARTITIONS}) * interval '1 day' FROM generate_series($1::bigint, $2::bigint) AS g"
        )))
        .bind(i64::try_from(done)?)
        .bind(i64::try_from(done + n - 1)?)
        .execute(bench.admin())
        .await?;
        done += n;
    }
    if old_rows > 0 {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {TABLE} (state, queued_at, started_at, finished_at, last_heartbeat_at, worker_hostname)
             SELECT 'completed', now() - ({LIVE_PARTITIONS} + g % {OLD_PARTITIONS}) * interval '1 day',
                    now() - interval '9 days', now() - interval '9 days', now() - interval '9 days', 'old'
             FROM generate_series(1, $1::bigint) AS g"
        )))
        .bind(i64::try_from(old_rows)?)
        .execute(bench.admin())
        .await?;
    }
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TABLE}")))
        .execute(bench.admin())
        .await?;
    Ok(())
}

/// The three runs at `handlers` handlers, `jobs` each; the third beside a
/// purger dropping five partitions of `old_rows` finished rows in all.
pub(crate) async fn run(
    bench: &Bench,
    handlers: usize,
    jobs: u64,
    old_rows: u64,
    batch: u64,
) -> Result<Vec<PartitionRun>> {
    let mut runs = Vec::new();
    bench.prepare(0, jobs, batch).await?;
    let run = crate::framework::burn(bench, Mode::Heartbeat, handlers, jobs).await?;
    runs.push(PartitionRun {
        label: "plain table",
        handlers,
        run,
        passes: Vec::new(),
    });
    prepare(bench, jobs, 0, batch).await?;
    let run = crate::framework::burn(bench, Mode::Heartbeat, handlers, jobs).await?;
    runs.push(PartitionRun {
        label: "partitioned, jobs in 10 partitions",
        handlers,
        run,
        passes: Vec::new(),
    });
    prepare(bench, jobs, old_rows, batch).await?;
    let (run, passes) = burn_beside_purger(bench, handlers, jobs).await?;
    runs.push(PartitionRun {
        label: "partitioned, purger dropping 5 old partitions",
        handlers,
        run,
        passes,
    });
    Ok(runs)
}

/// A burn-down with a purger pass every second beside it (its own pool).
async fn burn_beside_purger(
    bench: &Bench,
    handlers: usize,
    jobs: u64,
) -> Result<(Run, Vec<(Duration, Duration, usize)>)> {
    let pool = bench.pool(2).await?;
    let table = JobTable::new(&pool, JobTableOptions::new(TABLE)).await?;
    let mut o = PurgeOptions::new();
    o.max_age = vec![(JobState::Completed, Duration::from_secs(24 * 3600))];
    o.partitions_ahead = 3;
    let purger = Purger::new(&pool, &table, o).await?;
    let passes = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let (passes, stop) = (passes.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Result::Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                let at = started.elapsed();
                let purged = purger.purge_once().await?;
                passes.lock().await.push((
                    at,
                    started.elapsed() - at,
                    purged.partitions_dropped.len(),
                ));
            }
        })
    };
    let run = crate::framework::burn(bench, Mode::Heartbeat, handlers, jobs).await;
    stop.cancel();
    task.await??;
    pool.close().await;
    let passes = passes.lock().await.clone();
    Ok((run?, passes))
}

/// The workload's table, the plain run first.
pub(crate) fn table(runs: &[PartitionRun]) -> Option<Table> {
    let plain = runs.first()?.run.rate();
    Some(Table {
        title: "Partitioned job table, heartbeat handling: claim rate beside the plain table"
            .into(),
        headers: vec![
            "table",
            "handlers",
            "jobs",
            "jobs/s",
            "÷ plain",
            "slowest second",
            "stmts/job",
            "purger passes (at s: took, dropped)",
        ],
        rows: runs
            .iter()
            .map(|r| {
                let slowest = r.run.per_second.iter().min().copied();
                let passes: Vec<String> = r
                    .passes
                    .iter()
                    .map(|(at, took, dropped)| {
                        format!(
                            "{:.1}: {:.0} ms, {dropped}",
                            at.as_secs_f64(),
                            took.as_secs_f64() * 1000.0
                        )
                    })
                    .collect();
                vec![
                    r.label.to_owned(),
                    r.handlers.to_string(),
                    count(r.run.jobs),
                    rate(r.run.rate()),
                    format!("{:.2}", r.run.rate() / plain.max(1e-9)),
                    slowest.map_or("n/a".into(), |s| rate(s as f64)),
                    r.run.statements_per_job(),
                    if passes.is_empty() {
                        "none".into()
                    } else {
                        passes.join("; ")
                    },
                ]
            })
            .collect(),
    })
}

/// Jobs/s in each full second of every run, so a dip during a drop shows.
pub(crate) fn series_lines(runs: &[PartitionRun]) -> Vec<String> {
    runs.iter()
        .map(|r| {
            let parts: Vec<String> = r.run.per_second.iter().map(|n| rate(*n as f64)).collect();
            format!("{}: jobs/s per second: {}", r.label, parts.join(" "))
        })
        .collect()
}
