//! The `bloat` workload: dbworker over dead index entries vacuum cannot remove.
//!
//! 1. A burn-down of `--bloat-jobs` queued rows: jobs/s per 5 s window, the
//!    last beside the first (claimed rows' dead entries pile up at the front of
//!    the claim's index between autovacuum passes).
//! 2. Jobs offered at `--bloat-rate` per second for `--bloat-seconds`, while a
//!    REPEATABLE READ transaction elsewhere pins the xmin for the middle
//!    `--bloat-pin-seconds` (an analytics query, a forgotten `BEGIN`):
//!    completions per 10 s window, pickup p50/p99 before and during the pin,
//!    dead tuples at the pin's end and WAL bytes per job.
//!
//! Each runs with the claim cursor (the default), without it, and as the
//! raw-SQL floor (`floor.rs`'s claim and completion, which has no cursor; in
//! the offered run it polls every 10 ms), one after the other, so the three
//! are compared within one run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{DbStore, new_worker};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use crate::db::{Bench, Mode, TABLE};
use crate::framework::{self, NoOp, Progress, Starts};
use crate::latency::{lock, percentile};
use crate::report::Table;
use crate::{Result, progress};

/// Handlers of the bloat runs' worker.
const HANDLERS: usize = 64;

/// Who claims in a bloat run (`--bloat-claims`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Claims {
    /// dbworker with its claim cursor (the default).
    Cursor,
    /// dbworker without the cursor.
    NoCursor,
    /// The raw-SQL floor.
    Floor,
}

/// One burn-down: jobs/s per 5 s window.
#[derive(Debug)]
pub(crate) struct BurnDown {
    claims: Claims,
    jobs: u64,
    windows: Vec<f64>,
}

/// One offered-load run under a pinned xmin.
#[derive(Debug)]
pub(crate) struct Offered {
    claims: Claims,
    rate: f64,
    seconds: u64,
    pin_seconds: u64,
    offered: u64,
    completed: u64,
    /// Completions per 10 s window.
    windows: Vec<u64>,
    before: (Duration, Duration),
    during: (Duration, Duration),
    dead_tuples: i64,
    wal_bytes_per_job: f64,
}

fn label(claims: Claims) -> &'static str {
    match claims {
        Claims::Cursor => "cursor (default)",
        Claims::NoCursor => "no cursor",
        Claims::Floor => "raw-SQL floor (no cursor)",
    }
}

/// Burns down `jobs` queued rows with or without the claim cursor, or as the
/// floor (`floor` = its connections and claim size).
pub(crate) async fn burn_down(
    bench: &Bench,
    jobs: u64,
    batch: u64,
    claims: Claims,
    floor: (usize, usize),
) -> Result<BurnDown> {
    bench.prepare(0, jobs, batch).await?;
    if claims == Claims::Floor {
        let run = crate::floor::heartbeat(bench, floor.0, floor.1, jobs).await?;
        return Ok(BurnDown {
            claims,
            jobs,
            windows: windows_of_5s(&run.per_second),
        });
    }
    let cursor = claims == Claims::Cursor;
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, HANDLERS))
        .await?;
    let mut options = framework::store_options(Mode::Heartbeat);
    if !cursor {
        options.claim.claim_cursor = None;
    }
    let table = framework::job_table(&pool).await?;
    let store = Arc::new(DbStore::new(&pool, &table, options).await?);
    let done = Progress::new();
    let handler = NoOp {
        progress: done.clone(),
        starts: None,
    };
    let worker = new_worker(
        store,
        handler,
        framework::worker_options(HANDLERS, Some(jobs))?,
    )?;
    let run = framework::measure(bench, &pool, &done, jobs, "bloat burn-down", async {
        Ok(worker.run().await)
    })
    .await?;
    Ok(BurnDown {
        claims,
        jobs,
        windows: windows_of_5s(&run.per_second),
    })
}

/// Jobs/s of each whole 5 s window.
fn windows_of_5s(per_second: &[u64]) -> Vec<f64> {
    per_second
        .chunks(5)
        .filter(|w| w.len() == 5)
        .map(|w| w.iter().sum::<u64>() as f64 / 5.0)
        .collect()
}

/// Offers jobs at `rate` per second for `seconds`, pinning the xmin for the
/// middle `pin_seconds`, with or without the claim cursor.
pub(crate) async fn offered(
    bench: &Bench,
    rate: f64,
    seconds: u64,
    pin_seconds: u64,
    claims: Claims,
    floor: (usize, usize),
) -> Result<Offered> {
    bench.fresh_table(0).await?;
    let done = Progress::new();
    let starts: Starts = Arc::default();
    let consumer = if claims == Claims::Floor {
        Consumer::Floor(
            crate::floor::poll(bench, floor.0, floor.1, done.clone(), starts.clone()).await?,
        )
    } else {
        let pool = bench
            .pool(framework::pool_size(Mode::Heartbeat, 16))
            .await?;
        let mut options = framework::store_options(Mode::Heartbeat);
        if claims == Claims::NoCursor {
            options.claim.claim_cursor = None;
        }
        let mut wo = framework::worker_options(16, None)?;
        crate::latency::enable_notify(&pool, &mut options, &mut wo).await?;
        let table = framework::job_table(&pool).await?;
        let store = Arc::new(DbStore::new(&pool, &table, options).await?);
        let handler = NoOp {
            progress: done.clone(),
            starts: Some(starts.clone()),
        };
        let worker = new_worker(store.clone(), handler, wo)?;
        let shutdown = worker.shutdown_handle();
        let running = tokio::spawn(worker.run());
        Consumer::Worker {
            pool,
            store,
            shutdown,
            running,
        }
    };
    let stop_sampling = CancellationToken::new();
    let sampler = done.sample(stop_sampling.clone());
    let wal_start = wal_lsn(bench).await?;

    let pin_from = Duration::from_secs(seconds.saturating_sub(pin_seconds) / 2);
    let pin_until = pin_from + Duration::from_secs(pin_seconds);
    let pin = tokio::spawn(pin_xmin(
        bench.url().to_owned(),
        pin_from,
        pin_until,
        bench.admin().clone(),
    ));
    let sent = insert_at_rate(bench, rate, Duration::from_secs(seconds)).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while lock(&starts).len() < sent.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead_tuples = pin.await??;
    consumer.stop().await?;
    stop_sampling.cancel();
    let per_second = sampler.await?;
    let wal = wal_bytes_since(bench, &wal_start).await?;

    let starts = lock(&starts);
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for (id, (t0, at)) in &sent {
        let Some(t1) = starts.get(id) else { continue };
        let wait = t1.saturating_duration_since(*t0);
        if *at < pin_from {
            before.push(wait);
        } else if *at < pin_until {
            during.push(wait);
        }
    }
    before.sort();
    during.sort();
    let completed = starts.len() as u64;
    let windows = per_second.chunks(10).map(|w| w.iter().sum()).collect();
    Ok(Offered {
        claims,
        rate,
        seconds,
        pin_seconds,
        offered: sent.len() as u64,
        completed,
        windows,
        before: (percentile(&before, 50), percentile(&before, 99)),
        during: (percentile(&during, 50), percentile(&during, 99)),
        dead_tuples,
        wal_bytes_per_job: wal / completed.max(1) as f64,
    })
}

/// What takes the offered jobs.
enum Consumer {
    Worker {
        pool: sqlx::PgPool,
        store: Arc<DbStore<framework::BenchJob>>,
        shutdown: workerutil::ShutdownHandle,
        running: tokio::task::JoinHandle<workerutil::WorkerSummary>,
    },
    Floor(crate::floor::Polling),
}

impl Consumer {
    async fn stop(self) -> Result<()> {
        match self {
            Consumer::Worker {
                pool,
                store,
                shutdown,
                running,
            } => {
                shutdown.graceful();
                running.await?;
                store.close().await;
                pool.close().await;
            }
            Consumer::Floor(polling) => polling.stop().await?,
        }
        Ok(())
    }
}

/// Holds a REPEATABLE READ snapshot from `from` to `until` (after the start of
/// the run); returns the table's dead tuples as the pin ends.
async fn pin_xmin(
    url: String,
    from: Duration,
    until: Duration,
    admin: sqlx::PgPool,
) -> Result<i64> {
    let start = Instant::now();
    tokio::time::sleep(from).await;
    let mut conn = PgConnection::connect(&url).await?;
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut conn)
        .await?;
    sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {TABLE}")))
        .execute(&mut conn)
        .await?;
    progress(format_args!("bloat: xmin pinned for {:?}", until - from));
    tokio::time::sleep(until.saturating_sub(start.elapsed())).await;
    let dead: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COALESCE(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = '{TABLE}'"
    )))
    .fetch_optional(&admin)
    .await?
    .unwrap_or(0);
    sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
    conn.close().await?;
    Ok(dead)
}

/// Inserts jobs at `rate` per second for `span`, a batch every 20 ms; returns
/// each job's send time and its offset from the start, by id.
async fn insert_at_rate(
    bench: &Bench,
    rate: f64,
    span: Duration,
) -> Result<HashMap<i64, (Instant, Duration)>> {
    let mut conn = PgConnection::connect(bench.url()).await?;
    let insert = format!(
        "INSERT INTO {TABLE} (queued_at) SELECT now() FROM generate_series(1, $1::bigint) RETURNING id"
    );
    let tick = Duration::from_millis(20);
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let (mut sent, mut owed) = (HashMap::new(), 0.0);
    while start.elapsed() < span {
        ticks.tick().await;
        owed += rate * tick.as_secs_f64();
        let n = owed.floor();
        owed -= n;
        if n < 1.0 {
            continue;
        }
        #[allow(clippy::cast_possible_truncation, reason = "a few dozen rows a tick")]
        let rows = n as i64;
        let t0 = Instant::now();
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(insert.clone()))
            .bind(rows)
            .fetch_all(&mut conn)
            .await?;
        for id in ids {
            sent.insert(id, (t0, t0 - start));
        }
    }
    conn.close().await?;
    Ok(sent)
}

async fn wal_lsn(bench: &Bench) -> Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(bench.admin())
        .await?)
}

async fn wal_bytes_since(bench: &Bench, start: &str) -> Result<f64> {
    let bytes: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(start)
            .fetch_one(bench.admin())
            .await?;
    Ok(bytes)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The burn-downs' table: first and last 5 s window.
pub(crate) fn burn_down_table(runs: &[BurnDown]) -> Table {
    Table {
        title: "Bloat: burn-down, jobs/s per 5 s window (heartbeat handling, 64 handlers)".into(),
        headers: vec![
            "claims",
            "jobs",
            "first window",
            "last window",
            "last ÷ first",
            "windows",
        ],
        rows: runs
            .iter()
            .map(|r| {
                let first = r.windows.first().copied().unwrap_or(0.0);
                let last = r.windows.last().copied().unwrap_or(0.0);
                vec![
                    label(r.claims).to_owned(),
                    r.jobs.to_string(),
                    format!("{first:.0}"),
                    format!("{last:.0}"),
                    format!("{:.2}", last / first.max(1e-9)),
                    r.windows
                        .iter()
                        .map(|w| format!("{w:.0}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                ]
            })
            .collect(),
    }
}

/// The offered-load runs' table.
pub(crate) fn offered_table(runs: &[Offered]) -> Table {
    let title = match runs.first() {
        Some(r) => format!(
            "Bloat: {:.0} jobs/s offered for {} s, xmin pinned for the middle {} s (heartbeat handling, 16 handlers, LISTEN on; the floor polls every 10 ms)",
            r.rate, r.seconds, r.pin_seconds
        ),
        None => "Bloat: offered load under a pinned xmin".into(),
    };
    Table {
        title,
        headers: vec![
            "claims",
            "offered",
            "completed",
            "slowest 10 s window ÷ offered",
            "pickup p50 / p99 before pin",
            "during pin",
            "p99 during ÷ before",
            "dead tuples at pin end",
            "WAL bytes/job",
        ],
        rows: runs
            .iter()
            .map(|r| {
                let per_window = r.rate * 10.0;
                // The first and last windows are partial (start-up, drain).
                let inner = r
                    .windows
                    .get(1..r.windows.len().saturating_sub(1))
                    .unwrap_or(&[]);
                let slowest = inner.iter().copied().min().unwrap_or(0) as f64;
                vec![
                    label(r.claims).to_owned(),
                    r.offered.to_string(),
                    r.completed.to_string(),
                    format!("{:.2}", slowest / per_window.max(1e-9)),
                    format!("{} / {}", ms(r.before.0), ms(r.before.1)),
                    format!("{} / {}", ms(r.during.0), ms(r.during.1)),
                    format!(
                        "{:.2}",
                        r.during.1.as_secs_f64() / r.before.1.as_secs_f64().max(1e-9)
                    ),
                    r.dead_tuples.to_string(),
                    format!("{:.0}", r.wal_bytes_per_job),
                ]
            })
            .collect(),
    }
}
