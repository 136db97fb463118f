//! Insert → handler start: one INSERT per statement, the clock read just
//! before the INSERT is sent and again on the handler's first line (both in
//! this process), matched by job id. At a low rate from one producer, NOTIFY
//! on and off; and from many producers at once (NOTIFY on), whose
//! transactions commit out of id order, so jobs commit behind the claim
//! cursor (with and without a snapshot that holds the xmin).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dbworker::{DbStore, StoreOptions, new_worker};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};
use workerutil::WorkerOptions;

use crate::db::{Bench, Mode, TABLE};
use crate::framework::{self, NoOp, Progress, Starts};
use crate::table::{Table, ms};
use crate::{Result, progress};

/// Handlers of the latency worker.
pub(crate) const HANDLERS: usize = 4;
/// Handlers of the many-producers runs (the rate is higher).
pub(crate) const MANY_HANDLERS: usize = 64;
/// The poll interval of the runs without LISTEN.
const POLL: Duration = Duration::from_millis(10);

/// One latency run's percentiles.
#[derive(Debug, Clone)]
pub(crate) struct Latency {
    /// What ran, honestly labelled.
    pub(crate) label: String,
    pub(crate) jobs: usize,
    pub(crate) p50: Duration,
    pub(crate) p95: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

/// The "NOTIFY on" variant's set-up. Returns whether LISTEN is really on (the
/// run is labelled accordingly).
pub(crate) async fn enable_notify(
    pool: &PgPool,
    store: &mut StoreOptions,
    worker: &mut WorkerOptions,
) -> Result<bool> {
    let trigger = dbworker::ddl::notify_trigger_sql(TABLE, &Default::default(), None)?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(trigger))
        .execute(pool)
        .await?;
    store.listen = dbworker::Listen::TableChannel;
    // Polling is only the backstop; an idle worker backs off to 5 s.
    worker.interval = Duration::from_secs(1);
    worker.max_interval = Some(Duration::from_secs(5));
    Ok(true)
}

/// Runs `jobs` inserts at `rate` per second against a waiting worker
/// (heartbeat handling), with NOTIFY on or off.
pub(crate) async fn run(bench: &Bench, jobs: u64, rate: f64, notify: bool) -> Result<Latency> {
    bench.fresh_table(0).await?;
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, HANDLERS))
        .await?;
    let mut store_options = framework::store_options(Mode::Heartbeat);
    let mut worker_options = framework::worker_options(HANDLERS, None)?;
    worker_options.interval = POLL;
    let listening = notify && enable_notify(&pool, &mut store_options, &mut worker_options).await?;
    let label = match (notify, listening) {
        (false, _) => format!("NOTIFY off: polling every {} ms", POLL.as_millis()),
        (true, true) => format!(
            "NOTIFY on: LISTEN, polling every {:?} as the backstop",
            worker_options.interval
        ),
        (true, false) => format!(
            "NOTIFY on: not wired yet, so polling every {} ms like the row above",
            POLL.as_millis()
        ),
    };
    progress(format_args!("latency run: {label}"));
    let waiting = Waiting::start(&pool, store_options, worker_options).await?;
    let mut conn = PgConnection::connect(bench.url()).await?;
    let sent = insert_at_rate(&mut conn, jobs, rate, Duration::ZERO).await?;
    conn.close().await?;
    waiting.finish(pool, label, &sent).await
}

/// Runs `jobs` inserts at `rate` per second in all, from `producers`
/// connections at once, against a waiting worker of [`MANY_HANDLERS`]
/// handlers (heartbeat handling, NOTIFY on); with `hold_xmin`, a REPEATABLE
/// READ snapshot taken before the first insert is held until the last job
/// started.
pub(crate) async fn run_many(
    bench: &Bench,
    jobs: u64,
    rate: f64,
    producers: usize,
    hold_xmin: bool,
) -> Result<Latency> {
    bench.fresh_table(0).await?;
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, MANY_HANDLERS))
        .await?;
    let mut store_options = framework::store_options(Mode::Heartbeat);
    let mut worker_options = framework::worker_options(MANY_HANDLERS, None)?;
    enable_notify(&pool, &mut store_options, &mut worker_options).await?;
    let label = format!(
        "{producers} producers, {rate:.0} jobs/s, NOTIFY on{}",
        if hold_xmin { ", xmin held" } else { "" }
    );
    progress(format_args!("latency run: {label}"));
    let waiting = Waiting::start(&pool, store_options, worker_options).await?;
    let pin = if hold_xmin {
        Some(hold_xmin_on(bench).await?)
    } else {
        None
    };
    let producers = producers.max(1);
    let each_rate = rate / producers as f64;
    let mut tasks = Vec::with_capacity(producers);
    for i in 0..producers {
        let n = jobs / producers as u64 + u64::from((i as u64) < jobs % producers as u64);
        // Spread over the first period, so the producers' inserts interleave.
        let offset = Duration::from_secs_f64(i as f64 / rate.max(0.1));
        let mut conn = PgConnection::connect(bench.url()).await?;
        tasks.push(tokio::spawn(async move {
            let sent = insert_at_rate(&mut conn, n, each_rate, offset).await;
            conn.close().await?;
            sent
        }));
    }
    let mut sent = HashMap::new();
    for task in tasks {
        sent.extend(task.await??);
    }
    let latency = waiting.finish(pool, label, &sent).await;
    if let Some(mut pin) = pin {
        sqlx::raw_sql("COMMIT").execute(&mut pin).await?;
        pin.close().await?;
    }
    latency
}

/// A connection in a REPEATABLE READ transaction that has taken its
/// snapshot: vacuum keeps every row version newer than it.
async fn hold_xmin_on(bench: &Bench) -> Result<PgConnection> {
    let mut conn = PgConnection::connect(bench.url()).await?;
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut conn)
        .await?;
    sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {TABLE}")))
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

/// A worker waiting for the inserts, recording when each handler started.
struct Waiting {
    starts: Starts,
    shutdown: workerutil::ShutdownHandle,
    running: tokio::task::JoinHandle<workerutil::WorkerSummary>,
}

impl Waiting {
    async fn start(
        pool: &PgPool,
        store_options: StoreOptions,
        worker_options: WorkerOptions,
    ) -> Result<Waiting> {
        let table = framework::job_table(pool).await?;
        let store = Arc::new(DbStore::new(pool, &table, store_options).await?);
        let starts: Starts = Arc::default();
        let handler = NoOp {
            progress: Progress::new(),
            starts: Some(starts.clone()),
        };
        let worker = new_worker(store, handler, worker_options)?;
        let shutdown = worker.shutdown_handle();
        let running = tokio::spawn(worker.run());
        // Let the worker reach its idle loop first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Waiting {
            starts,
            shutdown,
            running,
        })
    }

    /// Waits for every job `sent` to start (30 s at most), stops the worker
    /// and returns the percentiles of send → start.
    async fn finish(
        self,
        pool: PgPool,
        label: String,
        sent: &HashMap<i64, Sent>,
    ) -> Result<Latency> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while lock(&self.starts).len() < sent.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.shutdown.graceful();
        self.running.await?;
        pool.close().await;

        let starts = lock(&self.starts);
        let mut phases: Vec<(Duration, Duration, Duration)> = sent
            .iter()
            .map(|(id, t)| {
                starts
                    .get(id)
                    .map(|t1| {
                        (
                            t1.saturating_duration_since(t.at),
                            t.returned.saturating_duration_since(t.at),
                            t1.saturating_duration_since(t.returned),
                        )
                    })
                    .ok_or_else(|| format!("job {id} never started"))
            })
            .collect::<std::result::Result<_, _>>()?;
        phases.sort();
        report_phases(&label, &phases);
        let waits: Vec<Duration> = phases.iter().map(|p| p.0).collect();
        Ok(Latency {
            label,
            jobs: waits.len(),
            p50: percentile(&waits, 50),
            p95: percentile(&waits, 95),
            p99: percentile(&waits, 99),
            max: waits.last().copied().unwrap_or_default(),
        })
    }
}

/// When a job's INSERT was sent, and when it returned (committed, its
/// NOTIFY queued).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    at: Instant,
    returned: Instant,
}

/// Where the time goes: the INSERT's own round trip (commit included)
/// apart from what follows its return (NOTIFY delivery, the claim, the
/// start), for the slowest pickups too. Printed, not tabled: a diagnosis.
fn report_phases(label: &str, sorted: &[(Duration, Duration, Duration)]) {
    let mut insert: Vec<Duration> = sorted.iter().map(|p| p.1).collect();
    let mut after: Vec<Duration> = sorted.iter().map(|p| p.2).collect();
    insert.sort();
    after.sort();
    progress(format_args!(
        "latency phases: {label}: INSERT round trip p50 {:?} p99 {:?} max {:?}; \
         INSERT return → handler start p50 {:?} p99 {:?} max {:?}",
        percentile(&insert, 50),
        percentile(&insert, 99),
        insert.last().copied().unwrap_or_default(),
        percentile(&after, 50),
        percentile(&after, 99),
        after.last().copied().unwrap_or_default(),
    ));
    let slowest: Vec<String> = sorted
        .iter()
        .rev()
        .take(5)
        .map(|(all, insert, after)| format!("{all:.1?} = {insert:.1?} + {after:.1?}"))
        .collect();
    progress(format_args!(
        "latency phases: slowest (insert + after): {}",
        slowest.join(", ")
    ));
}

/// Inserts `jobs` rows one statement each, `rate` per second, on `conn`,
/// starting after `offset`; returns when each INSERT was sent, by job id.
async fn insert_at_rate(
    conn: &mut PgConnection,
    jobs: u64,
    rate: f64,
    offset: Duration,
) -> Result<HashMap<i64, Sent>> {
    let insert = format!("INSERT INTO {TABLE} (queued_at) VALUES (now()) RETURNING id");
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = HashMap::new();
    for _ in 0..jobs {
        ticks.tick().await;
        let t0 = Instant::now();
        let id: i64 = sqlx::query_scalar(AssertSqlSafe(insert.clone()))
            .fetch_one(&mut *conn)
            .await?;
        sent.insert(
            id,
            Sent {
                at: t0,
                returned: Instant::now(),
            },
        );
    }
    Ok(sent)
}

/// The table of latency runs, one row each.
pub(crate) fn table(title: &str, runs: &[Latency]) -> Table {
    Table {
        title: title.to_owned(),
        headers: vec!["variant", "jobs", "p50", "p95", "p99", "max"],
        rows: runs
            .iter()
            .map(|l| {
                vec![
                    l.label.clone(),
                    l.jobs.to_string(),
                    ms(l.p50),
                    ms(l.p95),
                    ms(l.p99),
                    ms(l.max),
                ]
            })
            .collect(),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Nearest-rank percentile `p` (in %) of sorted values.
pub(crate) fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100);
    sorted[rank.clamp(1, sorted.len()) - 1]
}
