//! Global limits on real Postgres: four worker pools of sixteen handlers never
//! run more jobs of a limited queue at once than its limit, nor more of one
//! key than its per-key limit, nor start more per second than its rate, while
//! other queues run freely; a limit of 0 stops a queue.

use crate::TIMED;
use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    Aging, DbConditions, DbJob, DbStore, Enqueuer, Handling, JobTable, JobTableOptions, NewJob,
    StoreOptions,
    control::{DEFAULT_LIMIT_TABLE, Limit, Limits},
    ddl::limit_table_sql,
    new_worker,
};
use workerutil::{Handler, HandlerError, JobContext, Record, Store, WorkerOptions};

use common::{Db, QueuedJob};

/// Counts concurrent jobs per queue across every worker.
#[derive(Default)]
struct Counter {
    reports: AtomicUsize,
    most_reports: AtomicUsize,
    emails: AtomicUsize,
    most_emails: AtomicUsize,
}
impl Handler<DbStore<QueuedJob>> for Counter {
    async fn handle(
        &self,
        job: &mut DbJob<QueuedJob>,
        _ctx: &JobContext<DbStore<QueuedJob>>,
    ) -> Result<(), HandlerError> {
        let (now, most, work) = if job.record().queue == "reports" {
            (&self.reports, &self.most_reports, 10)
        } else {
            (&self.emails, &self.most_emails, 5)
        };
        let running = now.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(work)).await;
        now.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn set_up() -> (Db, Limits, Enqueuer) {
    set_up_on(Db::new().await).await
}

/// The limits set-up on a table partitioned by day.
async fn set_up_partitioned() -> (Db, Limits, Enqueuer) {
    set_up_on(Db::partitioned().await).await
}

/// Moves every job into one of the last ten days' partitions (by id).
async fn spread_over_partitions(db: &Db) {
    db.execute("UPDATE jobs SET queued_at = now() - (id % 10) * interval '1 day'")
        .await;
    assert_eq!(db.partitions_in_use().await, 10);
}

/// `table` (the test table) with its queues limited by the default limit table.
fn limited_table_options(table: &str) -> JobTableOptions {
    let mut t = JobTableOptions::new(table);
    t.queue_column = Some("queue".into());
    t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    t
}

async fn set_up_on(db: Db) -> (Db, Limits, Enqueuer) {
    db.add_columns(
        |c| c.queue = true,
        &[
            limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
            "ALTER TABLE jobs ADD COLUMN customer text".into(),
        ],
    )
    .await;
    let table = JobTable::new(&db.pool, limited_table_options("jobs"))
        .await
        .unwrap();
    let limits = Limits::new(&db.pool, &table).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    (db, limits, enqueuer)
}

/// A store on a pool of its own: another process, as Postgres sees it.
async fn limited_store(db: &Db) -> Arc<DbStore<QueuedJob>> {
    let pool = db.db.pool(8).await.unwrap();
    let table = JobTable::new(&pool, limited_table_options("jobs j"))
        .await
        .unwrap();
    let mut o = StoreOptions::new("limited");
    o.handling = Handling::Heartbeat;
    Arc::new(DbStore::new(&pool, &table, o).await.unwrap())
}

async fn processing_reports(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'processing' AND queue = 'reports'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn four_processes_of_sixteen_handlers_never_exceed_a_queue_limit() {
    let _shared = TIMED.read().await;
    never_exceed_a_queue_limit(set_up().await, false).await;
}

/// The same with the jobs in ten partitions of a partitioned table.
#[tokio::test]
async fn on_a_partitioned_table_four_processes_never_exceed_a_queue_limit() {
    let _shared = TIMED.read().await;
    never_exceed_a_queue_limit(set_up_partitioned().await, true).await;
}

async fn never_exceed_a_queue_limit((db, limits, enqueuer): (Db, Limits, Enqueuer), spread: bool) {
    limits.set("reports", 3).await.unwrap();
    let mut jobs: Vec<NewJob> = (0..60).map(|_| NewJob::new().queue("reports")).collect();
    jobs.extend((0..200).map(|_| NewJob::new().queue("emails")));
    enqueuer.enqueue_many(&jobs).await.unwrap();
    if spread {
        spread_over_partitions(&db).await;
    }

    let counter = Arc::new(Counter::default());
    // Watch the table too: claimed-ahead jobs count as processing.
    let mut most_in_table = 0;
    run_four_processes(
        &db,
        async || limited_store(&db).await,
        counter.clone(),
        260,
        async || most_in_table = most_in_table.max(processing_reports(&db).await),
    )
    .await;
    let most = counter.most_reports.load(Ordering::SeqCst);
    assert_eq!(most, 3, "the limit is used, never exceeded");
    assert!(
        most_in_table <= 3,
        "{most_in_table} reports processing at once"
    );
    let emails = counter.most_emails.load(Ordering::SeqCst);
    assert!(
        emails > 3,
        "other queues are not held to the limit: {emails}"
    );
    assert_eq!(
        limits.list().await.unwrap(),
        [("reports".to_owned(), Limit::processing(3))]
    );
}

#[tokio::test]
async fn a_limit_of_zero_stops_a_queue_and_removing_it_frees_it() {
    let _shared = TIMED.read().await;
    limit_of_zero_stops_a_queue(set_up().await).await;
}

#[tokio::test]
async fn on_a_partitioned_table_a_limit_of_zero_stops_a_queue() {
    let _shared = TIMED.read().await;
    limit_of_zero_stops_a_queue(set_up_partitioned().await).await;
}

async fn limit_of_zero_stops_a_queue((db, limits, enqueuer): (Db, Limits, Enqueuer)) {
    let ids = enqueuer
        .enqueue_many(&[
            NewJob::new().queue("reports"),
            NewJob::new().queue("emails"),
        ])
        .await
        .unwrap();
    limits.set("reports", 0).await.unwrap();
    let store = limited_store(&db).await;
    let claimed = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    let claimed: Vec<i64> = claimed.iter().map(|j| j.record().id).collect();
    assert_eq!(claimed, [ids[1]], "only the unlimited queue");
    assert!(limits.remove("reports").await.unwrap());
    let claimed = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.record().id).collect::<Vec<_>>(),
        [ids[0]]
    );
}

async fn finish(db: &Db, ids: &[i64]) {
    sqlx::query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = ANY($1)")
        .bind(ids)
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_lowered_or_reset_limit_still_counts_the_jobs_already_running() {
    let _shared = TIMED.read().await;
    let (db, limits, enqueuer) = set_up().await;
    limits.set("reports", 3).await.unwrap();
    let jobs: Vec<NewJob> = (0..8).map(|_| NewJob::new().queue("reports")).collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let store = limited_store(&db).await;
    let claim = async || -> Vec<i64> {
        let jobs = store
            .dequeue("host", &DbConditions::new(), 10)
            .await
            .unwrap();
        jobs.iter().map(|j| j.record().id).collect()
    };
    let running = claim().await;
    assert_eq!(running.len(), 3, "the limit");
    assert!(claim().await.is_empty(), "no room");

    // Lowered to 1 while 3 run: nothing starts until only one is left.
    limits.set("reports", 1).await.unwrap();
    finish(&db, &running[..1]).await;
    assert!(
        claim().await.is_empty(),
        "two still run against a limit of 1"
    );
    finish(&db, &running[1..2]).await;
    assert!(claim().await.is_empty(), "one runs against a limit of 1");
    finish(&db, &running[2..]).await;
    assert_eq!(claim().await.len(), 1, "the lowered limit's one");

    // Removed and set again: the job that runs still counts.
    assert!(limits.remove("reports").await.unwrap());
    limits.set("reports", 2).await.unwrap();
    assert_eq!(claim().await.len(), 1, "one more beside the one running");
    assert!(claim().await.is_empty());
    assert_eq!(processing_reports(&db).await, 2);
}

/// Claims in lanes run side by side only while the limit is far; as it comes
/// near they fall back to claiming one at a time, so eight concurrent
/// claimers in four processes fill a limit of 6,010 exactly, never past it
/// (lanes run while 4 × 1,024 rows of room remain).
#[tokio::test]
async fn concurrent_claims_in_lanes_fill_a_large_limit_exactly() {
    let _shared = TIMED.read().await;
    let (db, limits, enqueuer) = set_up().await;
    limits.set("reports", 6010).await.unwrap();
    let jobs: Vec<NewJob> = (0..12_000)
        .map(|_| NewJob::new().queue("reports"))
        .collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(limited_store(&db).await);
    }
    let mut claimers = tokio::task::JoinSet::new();
    for store in stores.iter().chain(stores.iter()) {
        let store = store.clone();
        claimers.spawn(async move {
            let mut claimed = 0;
            loop {
                let jobs = store
                    .dequeue("host", &DbConditions::new(), 1000)
                    .await
                    .unwrap();
                if jobs.is_empty() {
                    return claimed;
                }
                claimed += jobs.len();
            }
        });
    }
    let mut claimed = 0;
    while let Some(n) = claimers.join_next().await {
        claimed += n.unwrap();
    }
    assert_eq!(claimed, 6010, "the limit, filled");
    assert_eq!(processing_reports(&db).await, 6010);
}

#[derive(Debug, sqlx::FromRow)]
struct CustomerJob {
    id: i64,
    customer: Option<String>,
}

impl Record for CustomerJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Jobs running now and the most at once, per customer (`-` for none) and in all.
#[derive(Default)]
struct Running {
    by_customer: HashMap<String, (usize, usize)>,
    now: usize,
    most: usize,
}

#[derive(Default)]
struct PerCustomer {
    running: std::sync::Mutex<Running>,
}

impl PerCustomer {
    fn enter(&self, customer: &str, delta: isize) {
        let mut r = self.running.lock().unwrap();
        let entry = r.by_customer.entry(customer.to_owned()).or_default();
        entry.0 = entry.0.checked_add_signed(delta).unwrap();
        entry.1 = entry.1.max(entry.0);
        r.now = r.now.checked_add_signed(delta).unwrap();
        r.most = r.most.max(r.now);
    }
}
impl Handler<DbStore<CustomerJob>> for PerCustomer {
    async fn handle(
        &self,
        job: &mut DbJob<CustomerJob>,
        _ctx: &JobContext<DbStore<CustomerJob>>,
    ) -> Result<(), HandlerError> {
        let customer = job.record().customer.clone().unwrap_or_else(|| "-".into());
        self.enter(&customer, 1);
        tokio::time::sleep(Duration::from_millis(15)).await;
        self.enter(&customer, -1);
        Ok(())
    }
}

async fn customer_store(db: &Db) -> Arc<DbStore<CustomerJob>> {
    let pool = db.db.pool(8).await.unwrap();
    let mut t = limited_table_options("jobs j");
    t.limit_key_column = Some("customer".into());
    let table = JobTable::new(&pool, t).await.unwrap();
    let mut o = StoreOptions::new("per-key");
    o.handling = Handling::Heartbeat;
    Arc::new(DbStore::new(&pool, &table, o).await.unwrap())
}

/// Runs four worker processes of sixteen handlers until `total` jobs are
/// completed, calling `watch` on the table between polls.
async fn run_four_processes<R, H, F>(
    db: &Db,
    store: F,
    handler: Arc<H>,
    total: i64,
    mut watch: impl AsyncFnMut(),
) where
    R: Record + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Sync + Unpin + 'static,
    H: Handler<DbStore<R>> + 'static,
    F: AsyncFn() -> Arc<DbStore<R>>,
{
    let mut shutdowns = Vec::new();
    let mut runs = Vec::new();
    for n in 0..4 {
        let mut o = WorkerOptions::new(format!("process-{n}"));
        o.num_handlers = 16;
        o.interval = Duration::from_millis(20);
        let worker = new_worker(store().await, handler.clone(), o).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.count("completed").await < total {
        watch().await;
        assert!(Instant::now() < deadline, "the jobs did not finish");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for s in &shutdowns {
        s.graceful();
    }
    for run in runs {
        run.await.unwrap();
    }
}

#[tokio::test]
async fn a_per_key_limit_holds_each_key_across_four_processes() {
    let _shared = TIMED.read().await;
    let (db, _, enqueuer) = set_up().await;
    // A per-key limit is set through a description naming the key column.
    let mut keyed = limited_table_options("jobs");
    keyed.limit_key_column = Some("customer".into());
    let keyed = JobTable::new(&db.pool, keyed).await.unwrap();
    let limits = Limits::new(&db.pool, &keyed).await.unwrap();
    limits
        .set_limit("reports", Limit::processing(4).per_key(1))
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for i in 0..48 {
        let job = NewJob::new().queue("reports");
        jobs.push(job.set("customer", format!("c{}", i % 6)));
    }
    // Jobs without a key are held by the queue's limit only.
    jobs.extend((0..8).map(|_| NewJob::new().queue("reports")));
    enqueuer.enqueue_many(&jobs).await.unwrap();

    let counter = Arc::new(PerCustomer::default());
    let mut most_per_customer_in_table = 0;
    run_four_processes(
        &db,
        async || customer_store(&db).await,
        counter.clone(),
        56,
        async || {
            let most: Option<i64> = sqlx::query_scalar(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM jobs WHERE state = 'processing' AND customer IS NOT NULL GROUP BY customer) c",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            most_per_customer_in_table = most_per_customer_in_table.max(most.unwrap_or(0));
        },
    )
    .await;
    let (most_of_each, most) = {
        let r = counter.running.lock().unwrap();
        (r.by_customer.clone(), r.most)
    };
    for i in 0..6 {
        let (_, most_of_one) = most_of_each[&format!("c{i}")];
        assert_eq!(most_of_one, 1, "customer c{i} ran {most_of_one} at once");
    }
    assert!(
        most_per_customer_in_table <= 1,
        "{most_per_customer_in_table} of one customer processing"
    );
    assert!(most <= 4, "the queue limit still holds: {most}");
    assert!(most >= 2, "different customers run side by side: {most}");
    assert_eq!(
        limits.list().await.unwrap(),
        [("reports".to_owned(), Limit::processing(4).per_key(1))]
    );
}

#[tokio::test]
async fn a_rate_limit_spaces_starts_across_four_processes() {
    let _shared = TIMED.read().await;
    let (db, limits, enqueuer) = set_up().await;
    let (rate, burst) = (40.0, 4);
    limits
        .set_limit("emails", Limit::default().rate(rate, burst))
        .await
        .unwrap();
    let jobs: Vec<NewJob> = (0..100).map(|_| NewJob::new().queue("emails")).collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let counter = Arc::new(Counter::default());
    run_four_processes(
        &db,
        async || limited_store(&db).await,
        counter,
        100,
        async || {},
    )
    .await;

    // Start times from the database clock, in seconds since the first.
    let started: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM started_at - min(started_at) OVER ())::float8 FROM jobs ORDER BY started_at",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // A bucket of `burst` refilled at `rate`: no second holds more than
    // burst + rate starts (a little slack: a claim's start time is taken
    // before it waits for the table's claim lock).
    let most_in_a_second = (0..started.len())
        .map(|i| {
            started[i..]
                .iter()
                .take_while(|&&t| t < started[i] + 1.0)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_in_a_second as f64 <= f64::from(burst) + rate * 1.1,
        "{most_in_a_second} jobs started within one second"
    );
    let span = started.last().unwrap();
    assert!(
        *span >= (100.0 - f64::from(burst)) / rate * 0.9,
        "100 jobs at {rate}/s started within {span:.2} s"
    );
}

/// Log lines written while a future runs on this thread (the test's
/// current-thread runtime polls everything `JobTable::new` awaits).
async fn logged<T>(run: impl std::future::Future<Output = T>) -> (T, String) {
    let lines = common::LogLines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let out = {
        let _local = tracing::subscriber::set_default(subscriber);
        run.await
    };
    (out, lines.text())
}

/// A table without a queue column cannot enforce limits. Beside the standard
/// limit table it stays quiet while that table holds only other tables'
/// limits, and warns, naming the queue, once an operator sets one for it.
#[tokio::test]
async fn a_limit_this_table_cannot_enforce_is_warned_only_once_set_for_it() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    db.execute(&limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap())
        .await;
    db.execute(
        "INSERT INTO dbworker_limits (job_table, queue, max_processing) VALUES ('other_jobs', 'reports', 1)",
    )
    .await;
    let (table, logs) = logged(JobTable::new(&db.pool, JobTableOptions::new("jobs"))).await;
    table.unwrap();
    assert!(
        logs.contains("holds no limit for this table"),
        "the check ran and said so at debug level: {logs}"
    );
    assert!(!logs.contains("WARN"), "nothing to warn of: {logs}");

    db.execute(
        "INSERT INTO dbworker_limits (job_table, queue, max_processing) VALUES ('jobs', 'emails', 2)",
    )
    .await;
    let (table, logs) = logged(JobTable::new(&db.pool, JobTableOptions::new("jobs"))).await;
    table.unwrap();
    let warning = logs
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("a limit set for the table is warned of: {logs}"));
    assert!(
        warning.contains("not enforced by this process")
            && warning.contains("emails")
            && warning.contains("no queue column"),
        "{warning}"
    );
}

/// A limited claim's lane step commits its rows as this worker's; when the
/// serialized step after it fails (here its backend is terminated while it
/// waits for the lanes another session holds), the worker still gets those
/// rows, instead of leaving them `processing` with no worker until the
/// resetter takes them back.
#[tokio::test]
async fn a_failed_serialized_step_keeps_the_rows_the_lane_claimed() {
    let (db, limits, enqueuer) = set_up().await;
    // Room enough that no limit binds the lane step.
    limits.set("reports", 100_000).await.unwrap();
    enqueuer
        .enqueue_many(&[NewJob::new().queue("reports")])
        .await
        .unwrap();
    let store = limited_store(&db).await;
    // Three of the four lanes held: the lane step takes the fourth, claims
    // the one job (fewer than asked), and the serialized step waits.
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query(
        "SELECT pg_advisory_lock(hashtextextended(k, l))
           FROM unnest(ARRAY['dbworker_claim:jobs', 'dbworker_claim:public.jobs']) k,
                generate_series(0, 2) l",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let claim = tokio::spawn(async move { store.dequeue("host", &Default::default(), 5).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted LIMIT 1",
        )
        .fetch_optional(&db.pool)
        .await
        .unwrap();
        if let Some(pid) = waiting {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&db.pool)
                .await
                .unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the serialized step never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let jobs = claim.await.unwrap().expect("the lane's rows");
    assert_eq!(jobs.len(), 1);
    assert_eq!(processing_reports(&db).await, 1);
}

/// A rate the table's integers cannot count is refused by name; one written
/// by hand into the limit table (with no burst, so the bucket's size is the
/// rate) caps the queue's room instead of failing every claim on the table
/// with "integer out of range".
#[tokio::test]
async fn a_huge_rate_is_refused_and_one_written_by_hand_stops_no_claim() {
    let (db, limits, enqueuer) = set_up().await;
    let err = limits
        .set_limit("emails", Limit::default().rate(3e9, 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("rate_per_second"), "{err}");
    limits.set("reports", 100).await.unwrap();
    db.execute(
        "INSERT INTO dbworker_limits (job_table, queue, rate_per_second, refilled_at)
         SELECT job_table, 'fast', 3e9, now() - interval '1 second' FROM dbworker_limits LIMIT 1",
    )
    .await;
    enqueuer
        .enqueue_many(&[NewJob::new().queue("fast"), NewJob::new().queue("emails")])
        .await
        .unwrap();
    let huge: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dbworker_limits WHERE rate_per_second = 3e9")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(huge, 1);
    let store = limited_store(&db).await;
    let jobs = store.dequeue("host", &Default::default(), 5).await.unwrap();
    assert_eq!(jobs.len(), 2);
}

/// A per-key limit needs the column that keys it: set through a description
/// of the table that names no `limit_key_column`, it is refused by name and
/// nothing is written (it would not be enforced, and would still send every
/// claim of the table down the serialized limited path).
#[tokio::test]
async fn a_per_key_limit_is_refused_without_a_limit_key_column() {
    let (_db, limits, _) = set_up().await;
    let err = limits
        .set_limit("reports", Limit::processing(4).per_key(1))
        .await
        .expect_err("a per-key limit with no key column");
    assert!(
        matches!(
            &err,
            dbworker::Error::InvalidOption {
                field: "max_per_key",
                ..
            }
        ) && err.to_string().contains("limit_key_column"),
        "{err}"
    );
    assert_eq!(limits.list().await.unwrap(), [], "nothing was written");
    limits.set("reports", 4).await.unwrap();
}

/// Aging is not supported with limits yet, so a table that ages priorities
/// does not adopt the standard limit table on its own: it starts beside the
/// limits another table keeps there (`dbworker migration --limits` for one
/// table breaks no other), and warns, naming the queue, of a limit set for
/// it, which it does not enforce. Named in its options, the limit table is
/// still refused with aging.
#[tokio::test]
async fn an_aging_table_starts_beside_another_tables_limits_and_warns_of_its_own() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.priority = true;
        },
        &[limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO dbworker_limits (job_table, queue, max_processing) VALUES ('other_jobs', 'reports', 1)",
    )
    .await;
    let mut aging = JobTableOptions::new("jobs");
    aging.queue_column = Some("queue".into());
    aging.priority_column = Some("priority".into());
    aging.aging = Some(Aging::every(Duration::from_secs(60)));
    let (table, logs) = logged(JobTable::new(&db.pool, aging.clone())).await;
    table.expect("an aging table starts beside another table's limits");
    assert!(!logs.contains("WARN"), "nothing to warn of: {logs}");

    db.execute(
        "INSERT INTO dbworker_limits (job_table, queue, max_processing) VALUES ('jobs', 'emails', 2)",
    )
    .await;
    let (table, logs) = logged(JobTable::new(&db.pool, aging.clone())).await;
    table.unwrap();
    let warning = logs
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("a limit set for the table is warned of: {logs}"));
    assert!(
        warning.contains("not enforced by this process")
            && warning.contains("emails")
            && warning.contains("aging"),
        "{warning}"
    );

    aging.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    let err = JobTable::new(&db.pool, aging).await.unwrap_err();
    assert!(
        matches!(&err, dbworker::Error::InvalidOption { field: "aging", .. })
            && err.to_string().contains("limit table"),
        "{err}"
    );
}
