//! Issue 37's fault tests of durable signals and fenced checkpoints, with the
//! workers as child processes of this test binary (the ignored
//! `faults_child_worker`, run with `--exact`), SIGKILLed, SIGSTOPped and
//! across a server restart:
//!
//! - jobs that each wait for one signal, sent by 8 connections at a random
//!   offset in [−2 s, +2 s] of the job reaching its wait, while a worker
//!   process is SIGKILLed every 5 s and the server restarts once: each
//!   resumes and completes exactly once with its own payload, no wake-up is
//!   lost, no signal is consumed twice, waiting holds no handler slot, jobs
//!   never signalled (only sent signals in transactions that roll back) time
//!   out within ±1 s of their deadline, and a signal resumes its job through
//!   LISTEN, not the 500 ms poll (p50 ≤ 25 ms, p99 ≤ 125 ms), while every
//!   worker listens with a free handler (a killed worker's replacement
//!   starting and the restart, each until a handler slot is free again,
//!   are left out of it; how fast is the benchmark's figure);
//! - one job writing its output in chunks, each with its checkpoint in one
//!   transaction, its worker SIGKILLed at random moments: every row exactly
//!   once, at most one chunk redone per kill;
//! - an attempt paused (SIGSTOP) past the stall age and reset behind its back
//!   has every progress and checkpoint write refused once it resumes;
//! - 1,000 jobs reporting progress ten times a second add no statement
//!   beyond the heartbeats (`pg_stat_statements`).
//!
//! Sizes are scaled down; `DBWORKER_FULL_SCALE=1` runs the issue's (10,000
//! signalled jobs and 1,000 that time out; 1,000,000 rows and 20 kills).
//! `DBWORKER_FAULTS_SEED` repeats a run's random choices (each test prints
//! its seed).

use crate::common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dbworker::{
    DbJob, DbStore, Error, Handling, JobTable, JobTableOptions, Listen, Resetter, ResetterOptions,
    Signals, StoreOptions, ddl::signals_sql, new_worker,
};
use dbworker_testkit::ThrowawayServer;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use crate::HEAVY;
use common::{Db, Job};

const CHILD_URL: &str = "DBWORKER_FAULTS_CHILD_URL";
const CHILD_MODE: &str = "DBWORKER_FAULTS_CHILD_MODE";

fn full_scale() -> bool {
    std::env::var("DBWORKER_FULL_SCALE").is_ok_and(|v| v == "1")
}

/// Seconds since the epoch on this machine's clock, the clock the server's
/// `clock_timestamp()` reads too (it runs here).
fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

async fn sleep_until_epoch(at: f64) {
    let left = at - now_epoch();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// A small deterministic generator, so a failing run can be repeated with
/// the seed it printed.
struct Xorshift(u64);

impl Xorshift {
    fn seeded(test: &str) -> Xorshift {
        let seed = std::env::var("DBWORKER_FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                u64::from(
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap()
                        .subsec_nanos(),
                )
            });
        println!("{test}: DBWORKER_FAULTS_SEED={seed}");
        Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A server of the test's own with `settings`, or `None` after saying why
/// the test is skipped (a failure under `CI=true`).
async fn own_server(test: &str, settings: &'static [&'static str]) -> Option<ThrowawayServer> {
    match tokio::task::spawn_blocking(move || ThrowawayServer::start(settings))
        .await
        .unwrap()
    {
        Ok(server) => Some(server),
        Err(err) => {
            dbworker_testkit::skip(
                test,
                &format!("no PostgreSQL server of its own here: {err}"),
            );
            None
        }
    }
}

/// Durability traded for speed, as the shared test cluster does.
const FAST: [&str; 3] = [
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
];

/// Worker processes: this binary's `faults_child_worker` in one `mode`,
/// each with an `application_name` of its own so that the server's end of
/// a killed one can be waited for. Killed when dropped.
struct Workers {
    url: String,
    mode: &'static str,
    children: Vec<(Child, String)>,
    spawned: usize,
}

impl Workers {
    fn new(db: &Db, mode: &'static str) -> Workers {
        Workers {
            url: db.db.url().to_owned(),
            mode,
            children: Vec::new(),
            spawned: 0,
        }
    }

    fn spawn(&mut self) {
        self.spawned += 1;
        let name = format!("faults_{}_{}", self.mode, self.spawned);
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let url = format!("{}{sep}application_name={name}", self.url);
        let stderr = if std::env::var_os("DBWORKER_FAULTS_CHILD_STDERR").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                common::test_path(module_path!(), "faults_child_worker").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_URL, url)
            .env(CHILD_MODE, self.mode)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        self.children.push((child, name));
    }

    /// SIGKILLs the oldest worker and waits until the server has ended its
    /// backends (what they were running has then committed or rolled back).
    async fn kill_oldest(&mut self, pool: &PgPool) {
        let (mut child, name) = self.children.remove(0);
        child.kill().unwrap();
        child.wait().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&name)
            .fetch_one(pool)
            .await;
            if left.is_ok_and(|n| n == 0) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the killed worker's backends never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to worker `i`.
    fn signal(&self, i: usize, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.children[i].0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A worker process of the tests below, in the mode they name.
#[tokio::test]
#[ignore = "a worker process of the tests in this file, run by them"]
async fn faults_child_worker() {
    let (Ok(url), Ok(mode)) = (std::env::var(CHILD_URL), std::env::var(CHILD_MODE)) else {
        return;
    };
    match mode.as_str() {
        "signals" => signals_worker(&url).await,
        "chunks" => chunks_worker(&url).await,
        "stale" => stale_worker(&url).await,
        "report" => report_worker(&url).await,
        other => panic!("no worker mode {other}"),
    }
}

/// A pool, and a store over the test table (with what `table` adds) in
/// `handling`, with `tweak` applied to its options.
async fn child_store(
    url: &str,
    connections: u32,
    table: impl FnOnce(&mut JobTableOptions),
    tweak: impl FnOnce(&mut StoreOptions),
) -> (PgPool, Arc<DbStore<Job>>) {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(url)
        .await
        .unwrap();
    let mut t = Db::table_options();
    table(&mut t);
    let table = JobTable::new(&pool, t).await.unwrap();
    let mut o = Db::options_for_tests();
    tweak(&mut o);
    let store = Arc::new(DbStore::new(&pool, &table, o).await.unwrap());
    (pool, store)
}

fn tx(job: &mut DbJob<Job>) -> &mut PgConnection {
    job.tx().expect("transactional handling")
}

// ---------------------------------------------------------------------------
// Signals: waits, kills, a restart.
// ---------------------------------------------------------------------------

/// Handlers per signals worker process; two processes run at a time.
const SIGNAL_HANDLERS: usize = 16;
const SIGNAL_PROCESSES: usize = 2;
/// The signals workers' poll interval (`WorkerOptions::interval`). A wait's
/// timeout is found by the probe (250 ms, below) or a poll, whichever comes
/// first: well within the ±1 s the test allows.
const SIGNAL_POLL: Duration = Duration::from_millis(500);
/// How long a signalled job would wait for its signal: far beyond the test,
/// so a lost wake-up shows as a job still waiting with its signal sent.
const SIGNALLED_TIMEOUT: Duration = Duration::from_secs(3600);

/// Consumes its signal `go` and records it, in the job's transaction (so
/// the consumption, the record and the completion commit together);
/// without one, waits for it, or, resumed by its timeout, records that.
/// Between looking for the signal and waiting it pauses a few milliseconds,
/// so senders race the wait mark more often.
struct Waits;
impl Handler<DbStore<Job>> for Waits {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let timeout = job.record().payload["timeout_ms"]
            .as_u64()
            .map_or(SIGNALLED_TIMEOUT, Duration::from_millis);
        if let Some(payload) = job.signal::<Value>(ctx.store(), "go").await? {
            sqlx::query(
                "INSERT INTO outcomes (job_id, outcome, payload) VALUES ($1, 'signalled', $2)",
            )
            .bind(id)
            .bind(payload)
            .execute(tx(job))
            .await?;
            return Ok(());
        }
        let waited: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM waits WHERE job_id = $1)")
                .bind(id)
                .fetch_one(tx(job))
                .await?;
        if waited {
            sqlx::query("INSERT INTO outcomes (job_id, outcome) VALUES ($1, 'timed_out')")
                .bind(id)
                .execute(tx(job))
                .await?;
            return Ok(());
        }
        // Commits with the wait mark, in this transaction.
        sqlx::query("INSERT INTO waits (job_id, at) VALUES ($1, clock_timestamp())")
            .bind(id)
            .execute(tx(job))
            .await?;
        let pause = u64::try_from(id.rem_euclid(31)).unwrap();
        tokio::time::sleep(Duration::from_millis(pause)).await;
        Err(HandlerError::wait_for("go", timeout))
    }
}

async fn signals_worker(url: &str) {
    let (_pool, store) = child_store(
        url,
        28,
        |t| t.signals = true,
        |o| {
            o.handling = Handling::Transactional;
            o.stall.stalled_max_age = Duration::from_secs(2);
            // Kills and the restart reset jobs many times; none may fail.
            o.stall.max_num_resets = 1_000;
            o.listen = Listen::TableChannel;
            // A wait that times out is a job coming due: the claim cursor's
            // probe finds it, at most this long later (1 s by default, which
            // would leave no room in the ±1 s the test allows).
            o.claim.claim_cursor = Some(Duration::from_millis(250));
        },
    )
    .await;
    let mut o = WorkerOptions::new("signals");
    o.num_handlers = SIGNAL_HANDLERS;
    // Polls seldom: a woken job claimed well within this was claimed because
    // its worker heard the wake-up.
    o.interval = SIGNAL_POLL;
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    new_worker(store, Waits, o).unwrap().run().await;
}

/// What the signals test logs: each wait (committed with its mark), each
/// outcome (committed with the completion), and by trigger each claim
/// (whether it ended a wait by its timeout, and when that wait was due) and
/// each wake-up of a waiting job by a signal.
const SIGNAL_LOG_DDL: &str = r"
CREATE TABLE waits (job_id bigint NOT NULL, at timestamptz NOT NULL);
CREATE TABLE outcomes (job_id bigint NOT NULL, outcome text NOT NULL, payload jsonb);
CREATE TABLE claims (job_id bigint NOT NULL, at timestamptz NOT NULL, timed_out boolean NOT NULL, due timestamptz);
CREATE INDEX ON claims (job_id, at);
CREATE TABLE wakes (job_id bigint NOT NULL, at timestamptz NOT NULL);
CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO claims VALUES (NEW.id, clock_timestamp(), OLD.awaiting IS NOT NULL, OLD.process_after);
    RETURN NULL;
END $$;
CREATE TRIGGER log_claim AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.state = 'processing' AND OLD.state <> 'processing') EXECUTE FUNCTION log_claim();
CREATE FUNCTION log_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO wakes VALUES (NEW.id, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER log_wake AFTER UPDATE OF awaiting ON jobs FOR EACH ROW
    WHEN (OLD.awaiting IS NOT NULL AND NEW.awaiting IS NULL AND NEW.state = 'queued')
    EXECUTE FUNCTION log_wake();
";

/// The signals test's sizes and timeline, in seconds after its start `t0`.
struct SignalPlan {
    signalled: usize,
    unsignalled: usize,
    /// Signalled jobs come due evenly over [1, 1 + spread].
    spread: f64,
    /// When the server restarts.
    restart_at: f64,
    /// Jobs never signalled come due evenly over [unsignalled_from, 1 + spread],
    /// well after the restart, and each waits between `unsignalled_timeout`
    /// and twice that (so their deadlines do not follow their ids).
    unsignalled_from: f64,
    unsignalled_timeout: f64,
    kill_every: f64,
}

impl SignalPlan {
    fn new() -> SignalPlan {
        if full_scale() {
            SignalPlan {
                signalled: 10_000,
                unsignalled: 1_000,
                spread: 60.0,
                restart_at: 20.0,
                unsignalled_from: 26.0,
                unsignalled_timeout: 3.0,
                kill_every: 5.0,
            }
        } else {
            SignalPlan {
                signalled: 2_000,
                unsignalled: 200,
                spread: 12.0,
                restart_at: 4.0,
                unsignalled_from: 8.0,
                unsignalled_timeout: 3.0,
                kill_every: 5.0,
            }
        }
    }
}

/// One sender's work for one job: at `at`, optionally a send in a
/// transaction that rolls back, then (for a signalled job) the real one.
#[derive(Clone)]
struct PlannedSend {
    at: f64,
    job: i64,
    rolled_back_first: bool,
    payload: Option<Value>,
}

#[derive(Default)]
struct SendCounts {
    sent: AtomicU64,
    duplicates: AtomicU64,
    rolled_back: AtomicU64,
    retries: AtomicU64,
    /// When the last send that had to be retried got through (epoch µs).
    last_retried: AtomicU64,
}

/// Sends its signals in time order on a connection of its own, reconnecting
/// (and sending again: the dedupe key makes a repeat harmless) after an
/// error such as the server's restart.
async fn sender(
    url: String,
    signals: Signals,
    mut plan: Vec<PlannedSend>,
    counts: Arc<SendCounts>,
) {
    plan.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut conn: Option<PgConnection> = None;
    for s in plan {
        sleep_until_epoch(s.at).await;
        let mut retried = false;
        loop {
            match send_once(&mut conn, &url, &signals, &s, &counts).await {
                Ok(()) => break,
                Err(_) => {
                    conn = None;
                    retried = true;
                    counts.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        if retried {
            let micros = Duration::from_secs_f64(now_epoch()).as_micros();
            counts
                .last_retried
                .fetch_max(u64::try_from(micros).unwrap(), Ordering::Relaxed);
        }
    }
}

async fn send_once(
    conn: &mut Option<PgConnection>,
    url: &str,
    signals: &Signals,
    s: &PlannedSend,
    counts: &SendCounts,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if conn.is_none() {
        *conn = Some(PgConnection::connect(url).await?);
    }
    let c = conn.as_mut().unwrap();
    if s.rolled_back_first {
        let mut tx = c.begin().await?;
        signals
            .send_in(&mut tx, s.job, "go", json!("rolled back"), None)
            .await?;
        tx.rollback().await?;
        counts.rolled_back.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(payload) = &s.payload {
        let dedupe = format!("go-{}", s.job);
        let new = signals
            .send_in(c, s.job, "go", payload.clone(), Some(&dedupe))
            .await?;
        let counter = if new {
            &counts.sent
        } else {
            &counts.duplicates
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// What the monitor saw at `at`: the workers' LISTEN backends (`None`: the
/// server did not answer), the jobs waiting for a signal, how many of those
/// a worker held, the backlog (jobs due and not claimed yet), and the jobs
/// running (each holds a handler slot).
struct Sample {
    at: f64,
    listeners: Option<i64>,
    waiting: i64,
    waiting_held: i64,
    backlog: i64,
    running: i64,
}

async fn monitor(pool: PgPool, stop: CancellationToken) -> Vec<Sample> {
    let mut samples = Vec::new();
    while !stop.is_cancelled() {
        let row: Result<(i64, i64, i64, i64, i64), _> = sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND query LIKE 'LISTEN%'),
                    count(*) FILTER (WHERE awaiting IS NOT NULL),
                    count(*) FILTER (WHERE awaiting IS NOT NULL AND (state <> 'queued' OR worker_hostname <> '')),
                    count(*) FILTER (WHERE state IN ('queued', 'errored') AND awaiting IS NULL
                                       AND coalesce(process_after, now()) <= now()),
                    count(*) FILTER (WHERE state = 'processing')
               FROM jobs",
        )
        .fetch_one(&pool)
        .await;
        let at = now_epoch();
        samples.push(match row {
            Ok((listeners, waiting, waiting_held, backlog, running)) => Sample {
                at,
                listeners: Some(listeners),
                waiting,
                waiting_held,
                backlog,
                running,
            },
            Err(_) => Sample {
                at,
                listeners: None,
                waiting: 0,
                waiting_held: 0,
                backlog: 0,
                running: 0,
            },
        });
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    samples
}

/// Resets stalled jobs (those of killed workers) every 200 ms until `stop`.
async fn resetting(
    db: &Db,
    stall: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut ro = ResetterOptions::new("faults");
    ro.stall.stalled_max_age = stall;
    ro.stall.max_num_resets = 1_000;
    let resetter = Resetter::new(&db.pool, &db.table().await, ro)
        .await
        .unwrap();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let _ = resetter.reset_once().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// The times (epoch seconds) when a woken job could not be claimed at once
/// for want of a listener or a free handler: the restart and its aftermath,
/// from its start until the sends it held up have gone through (`settled`),
/// a worker listens again and the backlog (jobs due meanwhile, requeued
/// ones, those the held-up signals woke at once) and the jobs running leave
/// a handler slot free; and each run of samples with fewer than `listeners` LISTEN backends or
/// no answer (a killed worker until its replacement listens), from the good
/// sample before it until every worker listens again with the backlog
/// and running jobs leaving a slot free.
fn deaf_intervals(
    samples: &[Sample],
    restart: f64,
    settled: f64,
    listeners: i64,
    slots: i64,
) -> Vec<(f64, f64)> {
    // A handler free for a job woken now: the backlog and the jobs running
    // leave a slot (with the backlog merely within the slots, a job woken
    // then waited behind it: 150 ms on a busy CI machine).
    let caught_up =
        |s: &Sample| s.listeners.is_some_and(|n| n >= listeners) && s.backlog + s.running < slots;
    let recovered = samples
        .iter()
        .find(|s| s.at > settled && caught_up(s))
        .map_or(f64::INFINITY, |s| s.at);
    let mut out = vec![(restart, recovered)];
    let mut start: Option<f64> = None;
    for (i, s) in samples.iter().enumerate() {
        let deaf = s.listeners.is_none_or(|n| n < listeners);
        if deaf && start.is_none() {
            start = Some(if i > 0 { samples[i - 1].at } else { s.at });
        }
        if start.is_some() && caught_up(s) {
            out.push((start.take().unwrap(), s.at));
        }
    }
    if let Some(from) = start {
        out.push((from, f64::INFINITY));
    }
    out
}

/// Whether a wake-up at `at`, claimed `latency` seconds later, falls in one
/// of the `deaf` intervals, or just before one: within `grace` (the latency
/// allowed) of its start, so it may have waited for the restart or the kill
/// rather than for the workers. One woken earlier and claimed late counts.
fn overlaps_deaf(deaf: &[(f64, f64)], at: f64, latency: f64, grace: f64) -> bool {
    deaf.iter()
        .any(|(a, b)| at <= *b && at + latency.min(grace) >= *a)
}

/// The `pct` percentile of `sorted` (nearest rank); NaN for none.
fn percentile(sorted: &[f64], pct: usize) -> f64 {
    let rank = (sorted.len() * pct).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signalled_jobs_resume_exactly_once_under_kills_and_a_restart_and_the_others_time_out() {
    let _alone = HEAVY.write().await;
    let plan = SignalPlan::new();
    let test = "the signals fault test";
    let Some(server) = own_server(test, &FAST).await else {
        return;
    };
    let mut server = Some(server);
    let mut rng = Xorshift::seeded(test);
    let db = Db::on_server(server.as_ref().unwrap().admin_url()).await;
    db.execute(&signals_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.execute(SIGNAL_LOG_DDL).await;
    let table = db.table_with(|o| o.signals = true).await;
    let signals = Signals::new(&db.pool, &table).await.unwrap();

    let mut workers = Workers::new(&db, "signals");
    for _ in 0..SIGNAL_PROCESSES {
        workers.spawn();
    }
    // Both listen before the first job comes due.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if listening == i64::try_from(SIGNAL_PROCESSES).unwrap() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workers never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Every job, due at a planned time; each signalled one gets a secret
    // its signal carries back.
    let t0 = now_epoch() + 1.0;
    let mut secrets = Vec::new();
    let mut timeouts = Vec::new();
    let mut due = Vec::new();
    let step = plan.spread / plan.signalled as f64;
    for i in 0..plan.signalled {
        secrets.push(format!("s{i}-{}", rng.next()));
        timeouts.push(None::<i64>);
        due.push(1.0 + i as f64 * step);
    }
    let ns_step = (1.0 + plan.spread - plan.unsignalled_from) / plan.unsignalled as f64;
    for i in 0..plan.unsignalled {
        secrets.push(format!("n{i}-{}", rng.next()));
        let timeout = plan.unsignalled_timeout * (1.0 + rng.unit());
        timeouts.push(Some(
            i64::try_from(Duration::from_secs_f64(timeout).as_millis()).unwrap(),
        ));
        due.push(plan.unsignalled_from + i as f64 * ns_step);
    }
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "INSERT INTO jobs (payload, process_after)
         SELECT jsonb_strip_nulls(jsonb_build_object('secret', s, 'timeout_ms', t)),
                to_timestamp($4) + make_interval(secs => d)
           FROM unnest($1::text[], $2::int8[], $3::float8[]) AS u(s, t, d)
         RETURNING id, payload->>'secret'",
    )
    .bind(&secrets)
    .bind(&timeouts)
    .bind(&due)
    .bind(t0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let id_of: HashMap<String, i64> = rows.into_iter().map(|(id, s)| (s, id)).collect();
    let mut signalled_ids = Vec::new();
    let mut unsignalled_ids = Vec::new();
    let mut plans: Vec<Vec<PlannedSend>> = vec![Vec::new(); 8];
    for (i, secret) in secrets.iter().enumerate() {
        let id = id_of[secret];
        let at = t0 + due[i] + (rng.unit() * 4.0 - 2.0);
        let send = if i < plan.signalled {
            signalled_ids.push(id);
            PlannedSend {
                at,
                job: id,
                rolled_back_first: rng.below(4) == 0,
                payload: Some(json!({"job": id, "secret": secret})),
            }
        } else {
            unsignalled_ids.push(id);
            PlannedSend {
                at,
                job: id,
                rolled_back_first: true,
                payload: None,
            }
        };
        plans[i % 8].push(send);
    }
    let counts = Arc::new(SendCounts::default());
    let senders: Vec<_> = plans
        .into_iter()
        .map(|p| {
            tokio::spawn(sender(
                db.db.url().to_owned(),
                signals.clone(),
                p,
                counts.clone(),
            ))
        })
        .collect();
    let stop = CancellationToken::new();
    let watching = tokio::spawn(monitor(db.pool.clone(), stop.clone()));
    let resetter = resetting(&db, Duration::from_secs(2), stop.clone()).await;

    // SIGKILL a worker every 5 s (starting another at once), restart the
    // server once, until every job has finished.
    let mut kills = 0;
    let mut next_kill = t0 + plan.kill_every;
    let mut restart: Option<(f64, f64)> = None;
    let give_up = t0 + 1.0 + plan.spread + 25.0;
    loop {
        let now = now_epoch();
        if restart.is_none() && now >= t0 + plan.restart_at {
            let begin = now_epoch();
            let mut s = server.take().unwrap();
            s = tokio::task::spawn_blocking(move || {
                s.restart().expect("restart");
                s
            })
            .await
            .unwrap();
            server = Some(s);
            restart = Some((begin, now_epoch()));
        }
        if now >= next_kill {
            workers.kill_oldest(&db.pool).await;
            workers.spawn();
            kills += 1;
            next_kill += plan.kill_every;
        }
        if restart.is_some() && senders.iter().all(|s| s.is_finished()) {
            let live: Result<i64, _> =
                sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state <> 'completed'")
                    .fetch_one(&db.pool)
                    .await;
            if live.is_ok_and(|n| n == 0) {
                break;
            }
        }
        if now > give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let finished = now_epoch() - t0;
    stop.cancel();
    for s in &senders {
        s.abort();
    }
    let samples = watching.await.unwrap();
    resetter.await.unwrap();
    drop(workers);
    let (restart_begin, restart_end) = restart.unwrap();

    // What happened, for the report.
    let count = |sql: &'static str, ids: Vec<i64>| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(ids)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let completed: i64 = count(
        "SELECT count(*) FROM jobs WHERE state = 'completed' AND id = ANY($1)",
        [signalled_ids.clone(), unsignalled_ids.clone()].concat(),
    )
    .await;
    let resets: i64 = count(
        "SELECT coalesce(sum(num_resets), 0)::int8 FROM jobs WHERE id = ANY($1)",
        signalled_ids.clone(),
    )
    .await;
    let before_wait = count(
        "SELECT count(*) FROM jobs j WHERE id = ANY($1) AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.job_id = j.id)",
        signalled_ids.clone(),
    )
    .await;
    let raced = count(
        "SELECT count(*) FROM waits w WHERE job_id = ANY($1) AND NOT EXISTS (SELECT 1 FROM wakes k WHERE k.job_id = w.job_id)",
        signalled_ids.clone(),
    )
    .await;
    let woken = count(
        "SELECT count(DISTINCT job_id) FROM wakes WHERE job_id = ANY($1)",
        signalled_ids.clone(),
    )
    .await;
    let max_waiting = samples.iter().map(|s| s.waiting).max().unwrap_or(0);
    let max_waiting_held = samples.iter().map(|s| s.waiting_held).max().unwrap_or(0);

    // Wake-up to claim, for every wake-up, and for those while a worker
    // listened.
    let wakes: Vec<(f64, Option<f64>)> = sqlx::query_as(
        "SELECT extract(epoch FROM w.at)::float8,
                extract(epoch FROM (SELECT min(c.at) FROM claims c WHERE c.job_id = w.job_id AND c.at >= w.at) - w.at)::float8
           FROM wakes w",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let slots = i64::try_from(SIGNAL_PROCESSES * SIGNAL_HANDLERS).unwrap();
    let last_retried = Duration::from_micros(counts.last_retried.load(Ordering::Relaxed));
    let settled = restart_end.max(last_retried.as_secs_f64());
    let deaf = deaf_intervals(
        &samples,
        restart_begin,
        settled,
        i64::try_from(SIGNAL_PROCESSES).unwrap(),
        slots,
    );
    let deaf_after_start: Vec<(f64, f64)> = deaf.iter().map(|(a, b)| (a - t0, b - t0)).collect();
    let never_claimed = wakes.iter().filter(|(_, l)| l.is_none()).count();
    // The p99 allowed below: a wake-up that late before a deaf interval
    // may have waited for it.
    let grace = SIGNAL_POLL.as_secs_f64() / 4.0;
    let mut all: Vec<f64> = wakes.iter().filter_map(|(_, l)| *l).collect();
    let mut listening: Vec<f64> = wakes
        .iter()
        .filter(|(at, l)| !overlaps_deaf(&deaf, *at, l.unwrap_or(0.0), grace))
        .filter_map(|(_, l)| *l)
        .collect();
    all.sort_by(f64::total_cmp);
    listening.sort_by(f64::total_cmp);
    // The slowest while listening, as (seconds after t0, milliseconds).
    let mut slowest: Vec<(f64, f64)> = wakes
        .iter()
        .filter(|(at, l)| !overlaps_deaf(&deaf, *at, l.unwrap_or(0.0), grace))
        .filter_map(|(at, l)| l.map(|l| (at - t0, l * 1000.0)))
        .collect();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    slowest.truncate(10);

    // Timeouts: the claim that ended each unsignalled job's wait, against
    // the wait's deadline.
    let lateness: Vec<(i64, f64, f64)> = sqlx::query_as(
        "SELECT job_id, extract(epoch FROM at - due)::float8, extract(epoch FROM due)::float8
           FROM claims WHERE timed_out AND job_id = ANY($1)",
    )
    .bind(&unsignalled_ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut late: Vec<f64> = lateness.iter().map(|(_, l, _)| *l).collect();
    late.sort_by(f64::total_cmp);
    // The latest, as (deadline in s after t0, s late).
    let mut latest: Vec<(f64, f64)> = lateness.iter().map(|(_, l, d)| (d - t0, *l)).collect();
    latest.sort_by(|a, b| b.1.total_cmp(&a.1));
    latest.truncate(5);
    let first_deadline: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM min(due))::float8 FROM claims WHERE timed_out AND job_id = ANY($1)",
    )
    .bind(&unsignalled_ids)
    .fetch_one(&db.pool)
    .await
    .unwrap();

    println!(
        "{} signalled + {} unsignalled jobs, {completed} completed in {finished:.1} s; \
         {kills} worker processes SIGKILLed, server restarted at {:.1} s for {:.2} s; \
         {resets} resets of signalled jobs; signals: {} sent, {} repeats deduped, {} sends rolled back, \
         {} sends retried; signalled jobs: {before_wait} found their signal before waiting, \
         {raced} while their wait mark ran, {woken} woken while waiting; \
         at most {max_waiting} jobs waiting at once ({} handler slots); \
         signal to claim: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} wake-ups while listening \
         (the slowest at (s, ms) {slowest:.2?}) \
         (all {}: p99 {:.1} ms, max {:.1} ms; not every worker listening, or catching up (s after the start): {deaf_after_start:.2?}); \
         timeouts: {} claims, lateness min {:.3} s, p99 {:.3} s, max {:.3} s (the latest: (due s, late s) {latest:.2?})",
        plan.signalled,
        plan.unsignalled,
        restart_begin - t0,
        restart_end - restart_begin,
        counts.sent.load(Ordering::Relaxed),
        counts.duplicates.load(Ordering::Relaxed),
        counts.rolled_back.load(Ordering::Relaxed),
        counts.retries.load(Ordering::Relaxed),
        SIGNAL_PROCESSES * SIGNAL_HANDLERS,
        percentile(&listening, 50) * 1000.0,
        percentile(&listening, 99) * 1000.0,
        listening.last().unwrap_or(&0.0) * 1000.0,
        listening.len(),
        all.len(),
        percentile(&all, 99) * 1000.0,
        all.last().unwrap_or(&0.0) * 1000.0,
        late.len(),
        late.first().unwrap_or(&0.0),
        percentile(&late, 99),
        late.last().unwrap_or(&0.0),
    );

    // Every job completed, exactly once (its outcome commits with its
    // completion), a signalled one with its own payload.
    let lost: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT j.id, j.awaiting FROM jobs j
          WHERE j.state <> 'completed' AND EXISTS (SELECT 1 FROM jobs_signals s WHERE s.job_id = j.id AND s.consumed_at IS NULL)
          ORDER BY 1 LIMIT 20",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        lost.is_empty(),
        "lost wake-ups: jobs still not done with their signal in the mailbox: {lost:?}"
    );
    let total = i64::try_from(plan.signalled + plan.unsignalled).unwrap();
    assert_eq!(completed, total, "every job completes");
    let not_once: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j WHERE (SELECT count(*) FROM outcomes o WHERE o.job_id = j.id) <> 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(not_once, 0, "jobs that did not complete exactly once");
    let own_payload = count(
        "SELECT count(*) FROM outcomes o JOIN jobs j ON j.id = o.job_id
          WHERE o.outcome = 'signalled' AND o.job_id = ANY($1)
            AND o.payload = jsonb_build_object('job', j.id, 'secret', j.payload->'secret')",
        signalled_ids.clone(),
    )
    .await;
    assert_eq!(
        own_payload,
        i64::try_from(plan.signalled).unwrap(),
        "every signalled job resumed with its own payload"
    );
    // Each signal stored once (a retried send is deduped) and consumed
    // once; nothing of a rolled-back send.
    let (stored, jobs, consumed): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE consumed_at IS NOT NULL) FROM jobs_signals",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let n = i64::try_from(plan.signalled).unwrap();
    assert_eq!((stored, jobs, consumed), (n, n, n), "double consumptions");
    let leaked = count(
        "SELECT (SELECT count(*) FROM jobs_signals WHERE job_id = ANY($1))
              + (SELECT count(*) FROM wakes WHERE job_id = ANY($1))
              + (SELECT count(*) FROM outcomes WHERE outcome <> 'timed_out' AND job_id = ANY($1))",
        unsignalled_ids.clone(),
    )
    .await;
    assert_eq!(leaked, 0, "a send in a rolled-back transaction delivered");
    assert!(counts.rolled_back.load(Ordering::Relaxed) >= u64::try_from(plan.unsignalled).unwrap());
    // No wake-up lost: no signalled job's wait ended by its timeout.
    let timed_out_signalled = count(
        "SELECT count(*) FROM claims WHERE timed_out AND job_id = ANY($1)",
        signalled_ids.clone(),
    )
    .await;
    assert_eq!(timed_out_signalled, 0, "lost wake-ups");
    // Waiting holds no handler slot: far more jobs waited at once than
    // there are slots, and none of them was held by a worker.
    assert_eq!(max_waiting_held, 0, "a waiting job held by a worker");
    assert!(
        max_waiting > slots,
        "only {max_waiting} jobs waited at once"
    );
    // The unsignalled jobs timed out, each once, within ±1 s of its deadline.
    assert_eq!(lateness.len(), plan.unsignalled, "one timeout each");
    assert!(
        first_deadline.is_some_and(|d| d > restart_end + 1.0),
        "the restart overlapped the timeouts; the timeline is too tight for this machine"
    );
    let off: Vec<&(i64, f64, f64)> = lateness.iter().filter(|(_, l, _)| l.abs() > 1.0).collect();
    assert!(
        off.is_empty(),
        "timeouts off their deadline by over 1 s: {off:?}"
    );
    // Signal to resume while every worker listens with a free handler: in
    // the time LISTEN takes, not the poll's (a quarter of the interval at
    // p99, a twentieth at p50). How fast is the benchmark's to say (its
    // signal → resume figures, docs/benchmarks.md); the assertion leaves
    // room for a busy machine, where this run's p99 went from 11–25 ms to
    // about 100 ms.
    assert_eq!(never_claimed, 0, "woken jobs never claimed");
    assert!(
        listening.len() * 4 > wakes.len(),
        "too few wake-ups while listening: {} of {}",
        listening.len(),
        wakes.len()
    );
    let poll = SIGNAL_POLL.as_secs_f64();
    assert!(
        percentile(&listening, 50) <= poll / 20.0 && percentile(&listening, 99) <= poll / 4.0,
        "signal to resume p50 {:.1} ms, p99 {:.1} ms (polling every {poll} s); the slowest (s after the start, ms): {slowest:.2?}",
        percentile(&listening, 50) * 1000.0,
        percentile(&listening, 99) * 1000.0
    );
    assert!(kills >= 2, "{kills} kills");
    drop(db);
    drop(server);
}

// ---------------------------------------------------------------------------
// Checkpoints: chunks under SIGKILL, a stale attempt, reported progress.
// ---------------------------------------------------------------------------

/// Writes `items` output rows in chunks of `chunk`, each chunk and its
/// checkpoint committed together (transactional handling), resuming from
/// the checkpoint; notes each chunk it starts on a connection of its own,
/// outside the job's transaction, so redone chunks are counted.
struct Chunks {
    pool: PgPool,
}
impl Handler<DbStore<Job>> for Chunks {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let store = ctx.store();
        let items = job.record().payload["items"].as_i64().unwrap();
        let chunk = job.record().payload["chunk"].as_i64().unwrap();
        let mut next = job
            .checkpoint::<Value>(store)
            .await?
            .and_then(|c| c["next"].as_i64())
            .unwrap_or(0);
        while next < items {
            let end = (next + chunk).min(items);
            sqlx::query("INSERT INTO chunk_starts (first) VALUES ($1)")
                .bind(next)
                .execute(&self.pool)
                .await?;
            sqlx::query("INSERT INTO output (item) SELECT generate_series($1::int8, $2::int8)")
                .bind(next)
                .bind(end - 1)
                .execute(tx(job))
                .await?;
            job.save_checkpoint(store, json!({ "next": end })).await?;
            next = end;
        }
        Ok(())
    }
}

async fn chunks_worker(url: &str) {
    let (pool, store) = child_store(
        url,
        8,
        |t| t.progress = true,
        |o| {
            o.handling = Handling::Transactional;
            // Its own limits; the test's resetter resets a killed worker's
            // job once its heartbeat is 1.5 s old (a live attempt's row is
            // locked by its transaction, so never reset).
            o.stall.stalled_max_age = Duration::from_secs(5);
            o.stall.max_num_resets = 1_000;
        },
    )
    .await;
    let mut o = WorkerOptions::new("chunks");
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(250);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    new_worker(store, Chunks { pool }, o).unwrap().run().await;
}

async fn checkpoint_next(db: &Db, id: i64) -> i64 {
    db.scalar(
        "SELECT coalesce((checkpoint->>'next')::int8, 0) FROM jobs WHERE id = $1",
        id,
    )
    .await
}

#[tokio::test]
async fn a_chunked_job_killed_at_random_moments_writes_every_row_once() {
    let _shared = HEAVY.read().await;
    let (items, kills): (i64, usize) = if full_scale() {
        (1_000_000, 20)
    } else {
        (100_000, 5)
    };
    const CHUNK: i64 = 1_000;
    let chunks = items / CHUNK;
    let mut rng = Xorshift::seeded("the chunked checkpoint test");
    let db = Db::new().await;
    db.add_columns(|c| c.progress = true, &[]).await;
    db.execute(
        "CREATE TABLE output (item bigint NOT NULL);
         CREATE TABLE chunk_starts (first bigint NOT NULL)",
    )
    .await;
    let id = db
        .enqueue(1, json!({ "items": items, "chunk": CHUNK }))
        .await[0];
    // The chunks at which to kill: random, at least two apart, none at the
    // very start, and none in the last few chunks: a kill meant for chunk 98
    // of 100 could come after the job finished (seed 859191487 did), and the
    // test counts a reset per kill.
    let mut targets: Vec<i64> = Vec::new();
    while targets.len() < kills {
        let t = 2 + i64::try_from(rng.below(u64::try_from(chunks - 8).unwrap())).unwrap();
        if targets.iter().all(|o| (o - t).abs() >= 2) {
            targets.push(t);
        }
    }
    targets.sort_unstable();

    let stop = CancellationToken::new();
    let resetter = resetting(&db, Duration::from_millis(1_500), stop.clone()).await;
    let mut workers = Workers::new(&db, "chunks");
    workers.spawn();
    let started = tokio::time::Instant::now();
    // Each kill comes once the attempt the last kill left to a new worker
    // runs (the job was reset once per kill so far) and has written past
    // both the target and where it resumed.
    let mut resumed_from = 0;
    for (done, target) in targets.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (state, resets, next): (String, i32, i64) = sqlx::query_as(
                "SELECT state, num_resets, coalesce((checkpoint->>'next')::int8, 0) FROM jobs WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            if state == "processing"
                && usize::try_from(resets).unwrap() == done
                && next >= (target * CHUNK).max(resumed_from + CHUNK)
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the job never reached chunk {target} after kill {done}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Somewhere inside the next chunk.
        tokio::time::sleep(Duration::from_micros(rng.below(3_000))).await;
        workers.kill_oldest(&db.pool).await;
        resumed_from = checkpoint_next(&db, id).await;
        workers.spawn();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while db.state(id).await != "completed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    stop.cancel();
    resetter.await.unwrap();
    drop(workers);

    let (rows, distinct, low, high): (i64, i64, Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT count(*), count(DISTINCT item), min(item), max(item) FROM output")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let starts: i64 = sqlx::query_scalar("SELECT count(*) FROM chunk_starts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", id)
        .await;
    let redone = starts * CHUNK - items;
    println!(
        "{items} rows in chunks of {CHUNK}, {kills} SIGKILLs at chunks {targets:?}: \
         {rows} rows ({distinct} distinct), {starts} chunks started, {redone} items redone, \
         {resets} resets, {:.1} s",
        took.as_secs_f64()
    );
    assert_eq!(
        (rows, distinct, low, high),
        (items, items, Some(0), Some(items - 1)),
        "every row exactly once"
    );
    let kills = i64::try_from(kills).unwrap();
    assert!(
        redone <= kills * CHUNK,
        "{redone} items redone after {kills} kills"
    );
    assert_eq!(i64::from(resets), kills, "each kill interrupted the job");
    let checkpoint: Option<Value> = db
        .scalar("SELECT checkpoint FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(checkpoint, None, "completion drops the checkpoint");
}

/// Steps through `steps` steps every 20 ms, each a progress write and a
/// checkpoint write (heartbeat handling: each on the pool, at once), logging
/// every write (its attempt's token, when it was issued, whether it was
/// accepted) on a connection of its own. Once a write is refused it tries
/// one more of each kind, then gives up.
struct Steps {
    pool: PgPool,
}

impl Steps {
    async fn write(
        &self,
        job: &mut DbJob<Job>,
        store: &DbStore<Job>,
        token: i64,
        kind: &str,
        step: i64,
    ) -> Result<bool, HandlerError> {
        let issued = now_epoch();
        let written = if kind == "progress" {
            job.set_progress(store, json!({ "step": step })).await
        } else {
            job.save_checkpoint(store, json!({ "next": step })).await
        };
        let accepted = match written {
            Ok(()) => true,
            Err(Error::ProgressRefused { .. }) => false,
            Err(err) => return Err(err.into()),
        };
        sqlx::query(
            "INSERT INTO writes (token, kind, step, accepted, issued) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(token)
        .bind(kind)
        .bind(step)
        .bind(accepted)
        .bind(issued)
        .execute(&self.pool)
        .await?;
        Ok(accepted)
    }
}

impl Handler<DbStore<Job>> for Steps {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let store = ctx.store();
        let token = ctx.lease().token;
        let steps = job.record().payload["steps"].as_i64().unwrap();
        let mut next = job
            .checkpoint::<Value>(store)
            .await?
            .and_then(|c| c["next"].as_i64())
            .unwrap_or(0);
        while next < steps {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let progress = self.write(job, store, token, "progress", next).await?;
            let checkpoint = self
                .write(job, store, token, "checkpoint", next + 1)
                .await?;
            if !(progress && checkpoint) {
                self.write(job, store, token, "progress", next).await?;
                self.write(job, store, token, "checkpoint", next + 1)
                    .await?;
                return Err(HandlerError::retryable("this attempt lost the job"));
            }
            next += 1;
        }
        Ok(())
    }
}

/// The stalled age the test's resetter applies to the paused worker.
const STALE_AGE: Duration = Duration::from_secs(2);

async fn stale_worker(url: &str) {
    let (pool, store) = child_store(
        url,
        6,
        |t| t.progress = true,
        |o| {
            o.handling = Handling::Heartbeat;
            // Its own limits only matter to its own heartbeats, which come
            // every 10 s: after SIGCONT the attempt runs on without having
            // noticed it lost the job (the window a real heartbeat interval
            // leaves, made wide enough to be sure its writes come first).
            // The test's resetter resets it at 2 s.
            o.stall.stalled_max_age = Duration::from_secs(60);
            o.max_num_retries = 5;
        },
    )
    .await;
    let mut o = WorkerOptions::new("stale");
    o.interval = Duration::from_millis(20);
    // No claim beyond its one handler: claiming the reset job again while the
    // paused attempt still runs would cancel that attempt as superseded
    // before it tries the writes the test looks at (seen once in CI under
    // load); the next attempt starts when the stale one has given up.
    o.claim_ahead = Some(0);
    o.heartbeat_interval = Duration::from_secs(10);
    o.heartbeat_failure_limit = Some(Duration::from_secs(15));
    new_worker(store, Steps { pool }, o).unwrap().run().await;
}

#[tokio::test]
async fn a_paused_attempt_reset_behind_its_back_has_every_progress_and_checkpoint_write_refused() {
    paused_attempt(false).await;
}

/// The same on a table that keeps progress in its side table
/// (`migration --progress-table`): the worker finds it as it finds the
/// columns.
#[tokio::test]
async fn a_paused_attempt_reset_behind_its_back_is_refused_by_the_side_table_too() {
    paused_attempt(true).await;
}

async fn paused_attempt(side: bool) {
    let _shared = HEAVY.read().await;
    const STEPS: i64 = 100;
    let db = Db::new().await;
    if side {
        db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
            .await;
    } else {
        db.add_columns(|c| c.progress = true, &[]).await;
    }
    // Where the job's progress is kept: its row, or its side row.
    let kept = if side {
        "(SELECT s FROM jobs_progress s WHERE s.job_id = j.id)"
    } else {
        "j"
    };
    db.execute(
        "CREATE TABLE writes (token bigint NOT NULL, kind text NOT NULL, step bigint NOT NULL,
                              accepted boolean NOT NULL, issued float8 NOT NULL)",
    )
    .await;
    let id = db.enqueue(1, json!({ "steps": STEPS })).await[0];
    let mut workers = Workers::new(&db, "stale");
    workers.spawn();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let next = format!(
        "SELECT coalesce((({kept}).checkpoint->>'next')::int8, 0) FROM jobs j WHERE j.id = $1"
    );
    let checkpoint_next = async || -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(next.clone()))
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    while checkpoint_next().await < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never made progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopping = now_epoch();
    workers.signal(0, "-STOP");
    let stopped = now_epoch();
    tokio::time::sleep(STALE_AGE + Duration::from_millis(300)).await;
    let mut ro = ResetterOptions::new("stale");
    ro.stall.stalled_max_age = STALE_AGE;
    let out = Resetter::new(&db.pool, &db.table().await, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len(), 1, "the paused attempt's job is reset");
    let reset = now_epoch();
    workers.signal(0, "-CONT");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while db.state(id).await != "completed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(workers);

    let writes: Vec<(i64, String, i64, bool, f64)> =
        sqlx::query_as("SELECT token, kind, step, accepted, issued FROM writes ORDER BY issued")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let stale = writes[0].0;
    let of_stale = |from: f64, to: f64| -> Vec<&(i64, String, i64, bool, f64)> {
        writes
            .iter()
            .filter(|w| w.0 == stale && w.4 > from && w.4 < to)
            .collect()
    };
    // Issued before SIGSTOP was sent: accepted, but for the last one, which
    // may have been caught before it reached the server (then refused).
    let before = of_stale(f64::NEG_INFINITY, stopping);
    let (_, settled) = before.split_last().expect("writes before the pause");
    let during = of_stale(stopped, reset);
    let after = of_stale(reset, f64::INFINITY);
    let fresh: Vec<_> = writes.iter().filter(|w| w.0 != stale).collect();
    let refused = |kind: &str| after.iter().filter(|w| w.1 == kind && !w.3).count();
    println!(
        "the paused attempt: {} writes before SIGSTOP, {} issued after the reset: \
         {} progress and {} checkpoint writes refused; the next attempt: {} writes",
        before.len(),
        after.len(),
        refused("progress"),
        refused("checkpoint"),
        fresh.len()
    );
    assert!(
        settled.iter().all(|w| w.3),
        "the attempt's writes before the pause were refused: {settled:?}"
    );
    assert!(during.is_empty(), "writes issued while stopped: {during:?}");
    assert!(
        after.iter().any(|w| w.1 == "progress") && after.iter().any(|w| w.1 == "checkpoint"),
        "the paused attempt did not try both writes after the reset: {after:?}"
    );
    assert!(
        after.iter().all(|w| !w.3),
        "the paused attempt's writes after the reset were not all refused: {after:?}"
    );
    // The next attempt (one) resumed from the last checkpoint accepted and
    // had every write accepted.
    let tokens: std::collections::BTreeSet<i64> = fresh.iter().map(|w| w.0).collect();
    assert_eq!(tokens.len(), 1, "one attempt after the reset");
    assert!(fresh.iter().all(|w| w.3), "the next attempt was refused");
    let last_checkpoint = writes
        .iter()
        .filter(|w| w.0 == stale && w.1 == "checkpoint" && w.3)
        .map(|w| w.2)
        .max()
        .unwrap();
    assert_eq!(
        fresh[0].2, last_checkpoint,
        "resumed where the checkpoint said"
    );
    let accepted = i64::try_from(writes.iter().filter(|w| w.3).count()).unwrap();
    let (seq, progress, failures, resets): (i64, Option<Value>, i32, i32) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT ({kept}).progress_seq, ({kept}).progress, num_failures, num_resets FROM jobs j WHERE j.id = $1"
        )))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        seq, accepted,
        "each accepted write numbered one above the last, no refused one landed"
    );
    assert_eq!(progress, Some(json!({ "step": STEPS - 1 })));
    assert_eq!(
        (failures, resets),
        (0, 1),
        "the stale attempt's failure was refused too"
    );
}

/// Runs `run_ms`, reporting its progress every 100 ms when `report` is set
/// (without a statement of its own: it rides on the heartbeats).
struct Reports;
impl Handler<DbStore<Job>> for Reports {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let report = job.record().payload["report"] == json!(true);
        let run = Duration::from_millis(job.record().payload["run_ms"].as_u64().unwrap());
        let started = tokio::time::Instant::now();
        let mut n = 0;
        while started.elapsed() < run {
            if report {
                job.report_progress(ctx.store(), json!({ "n": n }))?;
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

const REPORT_PROCESSES: usize = 2;
const REPORT_JOBS: usize = 1_000;
const REPORT_BEAT: Duration = Duration::from_millis(250);

async fn report_worker(url: &str) {
    let (_pool, store) = child_store(
        url,
        6,
        |t| t.progress = true,
        |o| {
            o.handling = Handling::Heartbeat;
            o.stall.stalled_max_age = Duration::from_secs(5);
        },
    )
    .await;
    let mut o = WorkerOptions::new("report");
    o.num_handlers = REPORT_JOBS / REPORT_PROCESSES;
    // Every claimed job runs at once: all 1,000 run together.
    o.claim_ahead = Some(0);
    o.interval = Duration::from_millis(50);
    o.heartbeat_interval = REPORT_BEAT;
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    new_worker(store, Reports, o).unwrap().run().await;
}

/// `queryid → (calls, total execution ms, query)` of every statement run on
/// this database but the test's own.
async fn statement_calls(db: &Db) -> HashMap<i64, (i64, f64, String)> {
    let rows: Vec<(i64, i64, f64, String)> = sqlx::query_as(
        "SELECT queryid, calls, total_exec_time, query FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%faults-monitor%'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(q, c, ms, t)| (q, (c, ms, t)))
        .collect()
}

/// What one phase of the statement-count test saw: the statements run over
/// its window, the busiest ones (calls, mean ms, the query's start), and
/// then, per running job, how many had a reported value of at least 5 in
/// their row and the fewest progress writes one had.
struct Phase {
    statements: i64,
    busiest: Vec<(i64, f64, String)>,
    reported: i64,
    fewest_writes: Option<i64>,
}

/// Runs 1,000 jobs (reporting progress or not) at once and counts the
/// statements run on the database over `window` while they all run.
async fn statements_while_running(db: &Db, report: bool, window: Duration) -> Phase {
    db.enqueue(REPORT_JOBS, json!({ "report": report, "run_ms": 3_500 }))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT /* faults-monitor */ count(*) FROM jobs WHERE state = 'processing'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if running == i64::try_from(REPORT_JOBS).unwrap() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {running} jobs ran at once"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = statement_calls(db).await;
    tokio::time::sleep(window).await;
    let after = statement_calls(db).await;
    let (reported, fewest_writes): (i64, Option<i64>) = sqlx::query_as(
        "SELECT /* faults-monitor */ count(*) FILTER (WHERE (progress->>'n')::int >= 5), min(progress_seq)
           FROM jobs WHERE state = 'processing'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut busiest: Vec<(i64, f64, String)> = after
        .iter()
        .map(|(q, (calls, ms, text))| {
            let (c0, ms0) = before.get(q).map_or((0, 0.0), |b| (b.0, b.1));
            let n = calls - c0;
            let mean = if n > 0 { (ms - ms0) / n as f64 } else { 0.0 };
            (n, mean, text.chars().take(70).collect())
        })
        .filter(|(n, _, _)| *n > 0)
        .collect();
    busiest.sort_by_key(|b| std::cmp::Reverse(b.0));
    let statements = busiest.iter().map(|(n, _, _)| n).sum();
    busiest.truncate(5);
    db.wait_until_no_live_job(Duration::from_secs(30)).await;
    Phase {
        statements,
        busiest,
        reported,
        fewest_writes,
    }
}

#[tokio::test]
async fn progress_reported_ten_times_a_second_by_a_thousand_jobs_adds_no_statement_beyond_the_heartbeats()
 {
    let _shared = HEAVY.read().await;
    const WITH_STATEMENTS: [&str; 4] = [
        "fsync=off",
        "synchronous_commit=off",
        "full_page_writes=off",
        "shared_preload_libraries=pg_stat_statements",
    ];
    let test = "the progress statement-count test";
    let Some(server) = own_server(test, &WITH_STATEMENTS).await else {
        return;
    };
    let db = Db::on_server(server.admin_url()).await;
    if let Err(err) = sqlx::raw_sql("CREATE EXTENSION pg_stat_statements")
        .execute(&db.pool)
        .await
    {
        dbworker_testkit::skip(test, &format!("no pg_stat_statements: {err}"));
        return;
    }
    db.add_columns(|c| c.progress = true, &[]).await;
    let mut workers = Workers::new(&db, "report");
    for _ in 0..REPORT_PROCESSES {
        workers.spawn();
    }
    let window = Duration::from_millis(1_500);
    let quiet = statements_while_running(&db, false, window).await;
    let loud = statements_while_running(&db, true, window).await;
    drop(workers);
    let beats = i64::try_from(window.as_millis() / REPORT_BEAT.as_millis()).unwrap() + 1;
    let processes = i64::try_from(REPORT_PROCESSES).unwrap();
    println!(
        "{REPORT_JOBS} jobs in {REPORT_PROCESSES} processes, heartbeat every {REPORT_BEAT:?}, over {window:?}: \
         {} statements without progress ({:.2?}), {} while every job reported 10 times a second ({:.2?}); \
         {} jobs' rows had their reported progress, each written at least {:?} times",
        quiet.statements,
        quiet.busiest,
        loud.statements,
        loud.busiest,
        loud.reported,
        loud.fewest_writes,
    );
    assert!(
        loud.statements - quiet.statements <= processes * beats,
        "reporting progress added {} statements over {window:?}: more than one per heartbeat \
         interval per process ({beats} intervals × {processes} processes)",
        loud.statements - quiet.statements
    );
    // And the progress did reach the rows, by the heartbeats.
    assert_eq!(
        loud.reported,
        i64::try_from(REPORT_JOBS).unwrap(),
        "every running job's reported progress is in its row"
    );
    assert!(
        loud.fewest_writes.is_some_and(|n| n >= 2),
        "progress writes: {:?}",
        loud.fewest_writes
    );
    assert_eq!(
        (quiet.reported, quiet.fewest_writes),
        (0, Some(0)),
        "no progress without reports"
    );
    drop(db);
    drop(server);
}
