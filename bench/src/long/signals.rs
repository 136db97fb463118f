//! Signal → resume: jobs on a table with signals (`dbworker migration
//! --signals`) whose handler takes the signal `go` or, without one, waits
//! for it (`HandlerError::wait_for`); once every job of the round waits, a
//! sender sends each its signal (`Signals::send`, one connection, at a
//! steady rate), the clock read just before the send and again on the
//! first line of the resumed attempt's handler. Beside it, in the same
//! run and worker, the plain pickup: one-row INSERTs at the same rate, the
//! clock read before the INSERT and on the handler's first line. LISTEN is
//! on (the table's NOTIFY trigger; a signal NOTIFYs the same channel), and
//! polling is the backstop, as in the latency workload's "NOTIFY on" run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbworker::{DbJob, DbStore, JobTable, Signals, new_worker};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use workerutil::{Handler, HandlerError, JobContext, Outcome, Store as _};

use super::{plain_first, say};
use crate::Result;
use crate::db::{Bench, Mode, TABLE};
use crate::framework::{self, BenchJob};
use crate::latency::{self, lock, percentile};
use crate::table::ms;

/// The signal the jobs wait for.
const SIGNAL: &str = "go";
/// The longest wait (never reached: every job is signalled within seconds).
const WAIT: Duration = Duration::from_secs(60);
/// How long a phase may take to finish once its last insert or send is out.
const SETTLE: Duration = Duration::from_secs(30);

/// Sorted waits of one phase.
#[derive(Debug, Clone)]
pub(crate) struct Waits(pub(crate) Vec<Duration>);

impl Waits {
    fn new(mut waits: Vec<Duration>) -> Waits {
        waits.sort();
        Waits(waits)
    }

    pub(crate) fn p50(&self) -> Duration {
        percentile(&self.0, 50)
    }

    pub(crate) fn p99(&self) -> Duration {
        percentile(&self.0, 99)
    }

    pub(crate) fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    /// `p50 / p99 / max`.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} / {} / {}",
            ms(self.p50()),
            ms(self.p99()),
            ms(self.max())
        )
    }

    /// Every wait of `all`, sorted.
    pub(crate) fn pooled<'a>(all: impl IntoIterator<Item = &'a Waits>) -> Waits {
        Waits::new(all.into_iter().flat_map(|w| w.0.iter().copied()).collect())
    }
}

/// One round: plain pickup and signal → resume, in the order it says.
#[derive(Debug)]
pub(crate) struct SignalRound {
    pub(crate) plain_first: bool,
    pub(crate) plain: Waits,
    pub(crate) resumed: Waits,
}

/// Every round, and how the worker ran.
#[derive(Debug)]
pub(crate) struct SignalRounds {
    pub(crate) jobs: usize,
    pub(crate) rate: f64,
    pub(crate) handlers: usize,
    pub(crate) rounds: Vec<SignalRound>,
}

/// What the handler does, and what it recorded.
#[derive(Default)]
struct Resumes {
    /// Signal phase: take the signal or wait for it; else complete at once.
    signalled: AtomicBool,
    /// When each handler started: a plain job's only attempt, a signalled
    /// job's attempt that found its signal.
    starts: Mutex<HashMap<i64, Instant>>,
    /// Jobs whose wait was recorded.
    waiting: Mutex<Vec<i64>>,
    completed: AtomicU64,
}

impl Handler<DbStore<BenchJob>> for Resumes {
    async fn handle(
        &self,
        job: &mut DbJob<BenchJob>,
        ctx: &JobContext<DbStore<BenchJob>>,
    ) -> std::result::Result<(), HandlerError> {
        let started = Instant::now();
        let id = workerutil::Record::id(job.record());
        if self.signalled.load(Ordering::Acquire)
            && job.signal::<Value>(ctx.store(), SIGNAL).await?.is_none()
        {
            return Err(HandlerError::wait_for(SIGNAL, WAIT));
        }
        lock(&self.starts).insert(id, started);
        Ok(())
    }

    // After the outcome was written: the wait is committed.
    async fn post_handle(&self, record: &BenchJob, outcome: &Outcome) {
        match outcome {
            Outcome::Waiting { .. } => lock(&self.waiting).push(workerutil::Record::id(record)),
            Outcome::Completed => {
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// `rounds` interleaved rounds of `jobs` plain pickups and `jobs` signal →
/// resume waits, at `rate` per second, with one waiting worker (heartbeat
/// handling, LISTEN on).
pub(crate) async fn rounds(
    bench: &Bench,
    jobs: usize,
    rate: f64,
    rounds: usize,
) -> Result<SignalRounds> {
    let handlers = latency::HANDLERS;
    bench.fresh_table(0).await?;
    let ddl = dbworker::ddl::signals_sql(TABLE, &Default::default())?;
    // The mailbox outlives the job table: an old one would hold signals of
    // ids the new table hands out again.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {TABLE}_signals;\n{ddl}"
    )))
    .execute(bench.admin())
    .await?;
    let pool = bench
        .pool(framework::pool_size(Mode::Heartbeat, handlers))
        .await?;
    let mut store_options = framework::store_options(Mode::Heartbeat);
    let mut worker_options = framework::worker_options(handlers, None)?;
    latency::enable_notify(&pool, &mut store_options, &mut worker_options).await?;
    let mut options = framework::table_options();
    options.signals = true;
    let table = JobTable::new(&pool, options).await?;
    if !table.has_signals() {
        return Err("long: the bench table has no signals".into());
    }
    bench.settle().await?;
    let store = Arc::new(DbStore::new(&pool, &table, store_options).await?);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.wakeups().is_some_and(|w| w.is_live()) {
        if Instant::now() > deadline {
            return Err("long: the store's LISTEN never came up".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handler = Arc::new(Resumes::default());
    let worker = new_worker(store, handler.clone(), worker_options)?;
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    // Let the worker reach its idle loop first.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let send_pool = bench.pool(1).await?;
    let signals = Signals::new(&send_pool, &table).await?;
    let mut conn = PgConnection::connect(bench.url()).await?;
    let phases = Phases {
        bench,
        handler: &handler,
        jobs,
        rate,
    };
    let mut out = Vec::with_capacity(rounds);
    let mut result = Ok(());
    for r in 0..rounds {
        match phases.round(plain_first(r), &mut conn, &signals).await {
            Ok(round) => {
                say(format_args!(
                    "signals, round {}: insert → start p50/p99/max {}; signal → resumed start {}",
                    r + 1,
                    round.plain.summary(),
                    round.resumed.summary()
                ));
                out.push(round);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    shutdown.graceful();
    running.await?;
    conn.close().await?;
    send_pool.close().await;
    pool.close().await;
    drop_mailbox(bench).await?;
    result?;
    Ok(SignalRounds {
        jobs,
        rate,
        handlers,
        rounds: out,
    })
}

/// The two phases of a round, on the running worker.
struct Phases<'a> {
    bench: &'a Bench,
    handler: &'a Resumes,
    jobs: usize,
    rate: f64,
}

impl Phases<'_> {
    /// Both phases, the plain one first when `plain_first`.
    async fn round(
        &self,
        plain_first: bool,
        conn: &mut PgConnection,
        signals: &Signals,
    ) -> Result<SignalRound> {
        let (plain, resumed) = if plain_first {
            let plain = self.plain(conn).await?;
            (plain, self.resumed(signals).await?)
        } else {
            let resumed = self.resumed(signals).await?;
            (self.plain(conn).await?, resumed)
        };
        Ok(SignalRound {
            plain_first,
            plain,
            resumed,
        })
    }

    /// `jobs` one-row INSERTs at `rate`: insert → handler start.
    async fn plain(&self, conn: &mut PgConnection) -> Result<Waits> {
        self.handler.signalled.store(false, Ordering::Release);
        lock(&self.handler.starts).clear();
        let before = self.handler.completed.load(Ordering::Relaxed);
        let insert = format!("INSERT INTO {TABLE} (queued_at) VALUES (now()) RETURNING id");
        let mut ticks = ticker(self.rate);
        let mut sent = HashMap::with_capacity(self.jobs);
        for _ in 0..self.jobs {
            ticks.tick().await;
            let t0 = Instant::now();
            let id: i64 = sqlx::query_scalar(AssertSqlSafe(insert.clone()))
                .fetch_one(&mut *conn)
                .await?;
            sent.insert(id, t0);
        }
        self.finished(before, "plain jobs").await?;
        self.waits(&sent)
    }

    /// `jobs` jobs inserted at once, each waiting for its signal, then
    /// signalled at `rate`: send → resumed handler start.
    async fn resumed(&self, signals: &Signals) -> Result<Waits> {
        self.handler.signalled.store(true, Ordering::Release);
        lock(&self.handler.starts).clear();
        lock(&self.handler.waiting).clear();
        let before = self.handler.completed.load(Ordering::Relaxed);
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {TABLE} (queued_at) SELECT now() FROM generate_series(1, $1::bigint) RETURNING id"
        )))
        .bind(i64::try_from(self.jobs)?)
        .fetch_all(self.bench.admin())
        .await?;
        let deadline = Instant::now() + SETTLE;
        while lock(&self.handler.waiting).len() < self.jobs {
            if Instant::now() > deadline {
                return Err(format!(
                    "long: {} of {} jobs waited for their signal",
                    lock(&self.handler.waiting).len(),
                    self.jobs
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let awaiting: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {TABLE} WHERE awaiting = $1 AND state = 'queued'"
        )))
        .bind(SIGNAL)
        .fetch_one(self.bench.admin())
        .await?;
        if usize::try_from(awaiting)? != self.jobs {
            return Err(
                format!("long: {awaiting} jobs await {SIGNAL:?}, not {}", self.jobs).into(),
            );
        }
        let mut ticks = ticker(self.rate);
        let mut sent = HashMap::with_capacity(self.jobs);
        for id in ids {
            ticks.tick().await;
            let t0 = Instant::now();
            if !signals.send(id, SIGNAL, Value::Null, None).await? {
                return Err(format!("long: the signal to job {id} was not new").into());
            }
            sent.insert(id, t0);
        }
        self.finished(before, "signalled jobs").await?;
        self.waits(&sent)
    }

    /// Waits until `jobs` more jobs completed than `before`.
    async fn finished(&self, before: u64, what: &str) -> Result<()> {
        let jobs = u64::try_from(self.jobs)?;
        let deadline = Instant::now() + SETTLE;
        loop {
            let done = self.handler.completed.load(Ordering::Relaxed) - before;
            if done >= jobs {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("long: {done} of {jobs} {what} completed").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Start − send of every job `sent`.
    fn waits(&self, sent: &HashMap<i64, Instant>) -> Result<Waits> {
        let starts = lock(&self.handler.starts);
        let waits = sent
            .iter()
            .map(|(id, t0)| {
                starts
                    .get(id)
                    .map(|t1| t1.saturating_duration_since(*t0))
                    .ok_or_else(|| format!("long: job {id} never started after its send"))
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(Waits::new(waits))
    }
}

/// Ticks `rate` times a second; a late tick delays the rest.
fn ticker(rate: f64) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Leaves no mailbox or send function behind for the workloads after this.
async fn drop_mailbox(bench: &Bench) -> Result<()> {
    bench.fresh_table(0).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {TABLE}_signals;
         DROP FUNCTION IF EXISTS {TABLE}_signal_key(text, text, jsonb, text);
         DROP FUNCTION IF EXISTS {TABLE}_signal(bigint, text, jsonb, text);"
    )))
    .execute(bench.admin())
    .await?;
    Ok(())
}
