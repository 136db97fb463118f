//! LISTEN/NOTIFY wake-ups on real Postgres: an idle worker starts a new job at
//! once instead of at its next poll, and the listener comes back by itself
//! after its backend is terminated or the server restarts. And jobs woken by
//! signals: durable, delivered once, never lost to a sender that races the
//! wait.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{DbStore, Handling, JobTable, Listen, ddl::notify_trigger_sql, new_worker};
use serde_json::{Value, json};
use workerutil::testing::wait_for;
use workerutil::{Store, WorkerEvent, WorkerOptions};

use common::{Completes, Db, Job};
use dbworker_testkit::ThrowawayServer;

/// Polls so rarely that a job found within a second was found by a wake-up.
const SLOW_POLL: Duration = Duration::from_secs(20);

async fn listening_store(db: &Db) -> Arc<DbStore<Job>> {
    listening_store_on(db, db.table().await).await
}

/// A listening store over `table` (the test table, or a view of it).
async fn listening_store_on(db: &Db, table: JobTable) -> Arc<DbStore<Job>> {
    let ddl = notify_trigger_sql("jobs", &Default::default(), None).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.listen = Listen::TableChannel;
    let store = db.store_on(&table, o).await;
    wait_until(|| store.wakeups().is_some_and(|w| w.is_live())).await;
    store
}

async fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn listener_pid(db: &Db) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// Waits until the store listens again on a backend other than `first`, then
/// checks that a new job wakes a worker at once (not at its slow poll).
async fn listens_again_and_wakes_a_worker(db: &Db, store: Arc<DbStore<Job>>, first: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = listener_pid(db).await;
        if now.is_some_and(|pid| pid != first) && store.wakeups().unwrap().is_live() {
            break;
        }
        assert!(Instant::now() < deadline, "the listener never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let worker = new_worker(store, Completes, options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    let took = time_to_start(db, &mut events).await;
    assert!(
        took < SLOW_POLL / 4,
        "woken by NOTIFY after the reconnect: {took:?}"
    );
    shutdown.graceful();
    run.await.unwrap();
}

fn options() -> WorkerOptions {
    let mut o = WorkerOptions::new("listener");
    o.interval = SLOW_POLL;
    o.max_interval = Some(SLOW_POLL * 3);
    o.heartbeat_interval = Duration::from_millis(500);
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    o
}

/// Enqueues a job once the worker has gone idle (its claim found nothing, or
/// its last job finished: a short claim with live wake-ups waits for the next
/// notification) and returns how long the job took to start.
async fn time_to_start(
    db: &Db,
    events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>,
) -> Duration {
    wait_for(events, |e| {
        matches!(e, WorkerEvent::Idle | WorkerEvent::JobFinished { .. }).then_some(())
    })
    .await;
    let start = Instant::now();
    let id = db.enqueue(1, json!({})).await[0];
    wait_for(events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: got } if *got == id).then_some(())
    })
    .await;
    start.elapsed()
}

#[tokio::test]
async fn a_notification_wakes_an_idle_worker_at_once() {
    let db = Db::new().await;
    let store = listening_store(&db).await;
    let worker = new_worker(store, Completes, options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..3 {
        let took = time_to_start(&db, &mut events).await;
        assert!(
            took < SLOW_POLL / 4,
            "woken by NOTIFY, not the poll: {took:?}"
        );
    }
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(db.count("completed").await, 3);
}

/// Snoozes each job's first attempt for a second; completes the next.
struct SnoozesFirst(std::sync::Mutex<std::collections::HashSet<i64>>);

impl workerutil::Handler<DbStore<Job>> for SnoozesFirst {
    async fn handle(
        &self,
        job: &mut dbworker::DbJob<Job>,
        _ctx: &workerutil::JobContext<DbStore<Job>>,
    ) -> Result<(), workerutil::HandlerError> {
        if self.0.lock().unwrap().insert(job.record().id) {
            return Err(workerutil::HandlerError::snooze(Duration::from_secs(1)));
        }
        Ok(())
    }
}

/// No notification announces a job coming due: one scheduled by another
/// process, or this worker's own snooze. The claim cursor's probe (every
/// second by default) finds it and wakes the idle worker, which would
/// otherwise find it only at its next poll (20 s here, backing off to 60 s).
/// Through a view (no cursor there) the probe looks for it alone.
#[tokio::test]
async fn jobs_coming_due_wake_an_idle_worker_before_its_poll() {
    let db = Db::new().await;
    let on_table = listening_store(&db).await;
    jobs_coming_due_wake_the_worker(&db, on_table, "on the table").await;
    db.execute("DELETE FROM jobs; CREATE VIEW jobs_view AS SELECT * FROM jobs")
        .await;
    let table = db
        .table_with(|t| t.view_name = Some("jobs_view v".into()))
        .await;
    let through_view = listening_store_on(&db, table).await;
    jobs_coming_due_wake_the_worker(&db, through_view, "through a view").await;
    // The guide's shape: the view under the table's own alias, and a pause
    // table every store adopts; the claims and the probe's look then check
    // the table's row beside the view's under one name each.
    db.execute("DELETE FROM jobs").await;
    db.execute(&dbworker::ddl::pause_table_sql("dbworker_pauses").unwrap())
        .await;
    let table = db
        .table_with(|t| t.view_name = Some("jobs_view j".into()))
        .await;
    assert!(table.pause_table().is_some());
    let shared_alias = listening_store_on(&db, table).await;
    jobs_coming_due_wake_the_worker(&db, shared_alias, "through a view of the same alias").await;
}

async fn jobs_coming_due_wake_the_worker(db: &Db, store: Arc<DbStore<Job>>, how: &str) {
    let handler = SnoozesFirst(Default::default());
    let worker = new_worker(store, handler, options()).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Idle).then_some(())
    })
    .await;
    let start = Instant::now();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (payload, process_after) VALUES ('{}', now() + interval '1 second') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let dequeued = |e: &WorkerEvent| matches!(e, WorkerEvent::Dequeued { id: got } if *got == id);
    wait_for(&mut events, |e| dequeued(e).then_some(())).await;
    let scheduled = start.elapsed();
    // Its first attempt snoozes for a second: the worker goes idle again.
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::JobFinished { .. }).then_some(())
    })
    .await;
    let start = Instant::now();
    wait_for(&mut events, |e| dequeued(e).then_some(())).await;
    let snoozed = start.elapsed();
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(db.count("completed").await, 1);
    for (what, took) in [("scheduled", scheduled), ("snoozed", snoozed)] {
        assert!(
            took >= Duration::from_millis(900) && took < SLOW_POLL / 4,
            "{how}: the {what} job came due after 1 s and was claimed after {took:?}"
        );
    }
}

#[tokio::test]
async fn the_listener_reconnects_after_its_backend_is_terminated() {
    let db = Db::new().await;
    let store = listening_store(&db).await;
    let first = listener_pid(&db).await.expect("a LISTEN backend");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(killed);
    // It notices, reconnects and listens again on a new backend.
    listens_again_and_wakes_a_worker(&db, store, first).await;
}

#[tokio::test]
async fn the_listener_reconnects_after_a_server_restart() {
    // A server of its own: restarting the shared one would break other tests.
    let server = tokio::task::spawn_blocking(|| ThrowawayServer::start(&[]))
        .await
        .unwrap();
    let mut server = match server {
        Ok(server) => server,
        Err(err) => {
            dbworker_testkit::skip(
                "the server-restart test",
                &format!("no PostgreSQL server of its own to restart here: {err}"),
            );
            return;
        }
    };
    let db = Db::on_server(server.admin_url()).await;
    let store = listening_store(&db).await;
    let first = listener_pid(&db).await.expect("a LISTEN backend");

    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .unwrap();
    // The listener notices, reconnects to the restarted server and listens
    // again; meanwhile workers would poll.
    listens_again_and_wakes_a_worker(&db, store, first).await;
    drop(db);
    drop(server);
}

/// The test table with signals, a store over it in `handling`, and the
/// signal sender.
async fn signal_store(handling: Handling) -> (Db, DbStore<Job>, dbworker::Signals) {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let table = db.table_with(|o| o.signals = true).await;
    assert!(table.has_signals());
    let mut o = db.options();
    o.handling = handling;
    o.stall.stalled_max_age = Duration::from_secs(60);
    let store = DbStore::new(&db.pool, &table, o).await.unwrap();
    let signals = dbworker::Signals::new(&db.pool, &table).await.unwrap();
    (db, store, signals)
}

/// Claims the job (once its wait is over), within 5 s.
async fn claim_one(store: &DbStore<Job>) -> dbworker::DbJob<Job> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(mut job) = store
            .dequeue("host", &Default::default(), 1)
            .await
            .unwrap()
            .pop()
        {
            assert!(store.open(&mut job).await.unwrap());
            return job;
        }
        assert!(Instant::now() < deadline, "no job became claimable");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `(state, awaiting, seconds until it may run)` of job `id`.
async fn waiting(db: &Db, id: i64) -> (String, Option<String>, f64) {
    sqlx::query_as(
        "SELECT state, awaiting, EXTRACT(EPOCH FROM coalesce(process_after, now()) - now())::float8 FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

const HOUR: Duration = Duration::from_secs(3600);

/// A wait's timeout counts from the wait, on the database clock, also in
/// transactional handling, where the mark runs in the job's transaction
/// (whose `now()` is its start: a handler that ran 2 s lost 2 s of it).
#[tokio::test]
async fn a_transactional_wait_times_out_after_its_whole_timeout() {
    let (db, store, _signals) = signal_store(Handling::Transactional).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim_one(&store).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        store
            .mark_waiting(&mut job, "paid", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let (state, _, wait) = waiting(&db, id).await;
    assert_eq!(state, "queued");
    assert!(wait > 9.5 && wait <= 10.0, "it waits {wait} s of its 10");
}

#[tokio::test]
async fn a_signal_wakes_a_waiting_job_once_and_an_early_one_is_kept() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        let (db, store, signals) = signal_store(handling).await;
        let id = db.enqueue(1, json!({})).await[0];
        // Sent before the job ever waits: kept, and the wait ends at once.
        assert!(
            signals
                .send(id, "early", json!({"n": 1}), None)
                .await
                .unwrap()
        );
        let mut job = claim_one(&store).await;
        assert!(store.mark_waiting(&mut job, "early", HOUR).await.unwrap());
        let (state, awaiting, wait) = waiting(&db, id).await;
        assert_eq!((state.as_str(), awaiting), ("queued", None));
        assert!(wait <= 0.0, "it waits {wait} s for a signal it has");
        let mut job = claim_one(&store).await;
        assert_eq!(
            job.signal::<Value>(&store, "early").await.unwrap(),
            Some(json!({"n": 1}))
        );
        assert_eq!(
            job.signal::<Value>(&store, "early").await.unwrap(),
            None,
            "consumed once"
        );

        // Waits for one it does not have: parked until its timeout...
        assert!(store.mark_waiting(&mut job, "paid", HOUR).await.unwrap());
        let (state, awaiting, wait) = waiting(&db, id).await;
        assert_eq!(
            (state.as_str(), awaiting.as_deref()),
            ("queued", Some("paid"))
        );
        assert!(wait > 3500.0, "{wait}");
        // ... until it comes, once however often it is sent, never from a
        // transaction that rolled back.
        let mut tx = db.pool.begin().await.unwrap();
        assert!(
            signals
                .send_in(&mut tx, id, "paid", json!("rolled back"), None)
                .await
                .unwrap()
        );
        tx.rollback().await.unwrap();
        assert!(
            waiting(&db, id).await.2 > 3500.0,
            "a rolled-back send woke it"
        );
        assert!(
            signals
                .send(id, "paid", json!({"amount": 5}), Some("evt_1"))
                .await
                .unwrap()
        );
        assert!(
            !signals
                .send(id, "paid", json!({"amount": 5}), Some("evt_1"))
                .await
                .unwrap()
        );
        let (_, awaiting, wait) = waiting(&db, id).await;
        assert_eq!(awaiting, None);
        assert!(wait <= 0.0, "the signal did not wake it: {wait}");
        let mut job = claim_one(&store).await;
        let payment = job.signal::<Value>(&store, "paid").await.unwrap();
        assert_eq!(payment, Some(json!({"amount": 5})));
        assert!(store.mark_complete(&mut job).await.unwrap());
        let consumed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM jobs_signals WHERE consumed_at IS NOT NULL")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(consumed, 2, "{handling:?}");
    }
}

#[tokio::test]
async fn a_sender_racing_the_wait_is_never_lost_and_a_stale_attempt_consumes_nothing() {
    let (db, store, signals) = signal_store(Handling::Heartbeat).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim_one(&store).await;
    // The sender's transaction sends while the job still runs, and commits
    // only after the wait mark has started: the mark waits for it, then sees
    // the signal, and the job runs again at once instead of sleeping an hour.
    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        signals
            .send_in(&mut tx, id, "paid", json!(1), None)
            .await
            .unwrap()
    );
    let mark = async { store.mark_waiting(&mut job, "paid", HOUR).await.unwrap() };
    let commit = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.commit().await.unwrap();
    };
    let (marked, ()) = tokio::join!(mark, commit);
    assert!(marked);
    let (state, awaiting, wait) = waiting(&db, id).await;
    assert_eq!((state.as_str(), awaiting), ("queued", None));
    assert!(
        wait <= 0.0,
        "lost wake-up: the job waits {wait} s with its signal in the mailbox"
    );

    // A stale attempt (reset, and claimed again) consumes nothing.
    let mut stale = claim_one(&store).await;
    db.execute("UPDATE jobs SET state = 'queued'").await;
    let mut fresh = claim_one(&store).await;
    assert_eq!(stale.signal::<Value>(&store, "paid").await.unwrap(), None);
    assert_eq!(
        fresh.signal::<Value>(&store, "paid").await.unwrap(),
        Some(json!(1))
    );
    // A job that does not exist is named.
    let err = signals
        .send(999_999, "paid", json!(1), None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no job 999999"), "{err}");
}

#[tokio::test]
async fn a_handler_that_waits_frees_its_slot_and_resumes_with_its_signal() {
    struct Pays;
    impl workerutil::Handler<DbStore<Job>> for Pays {
        async fn handle(
            &self,
            job: &mut dbworker::DbJob<Job>,
            ctx: &workerutil::JobContext<DbStore<Job>>,
        ) -> Result<(), workerutil::HandlerError> {
            match job.signal::<Value>(ctx.store(), "paid").await? {
                Some(_) => Ok(()),
                None => Err(workerutil::HandlerError::wait_for("paid", HOUR)),
            }
        }
    }
    let (db, store, signals) = signal_store(Handling::Transactional).await;
    let ids = db.enqueue(3, json!({})).await;
    let store = Arc::new(store);
    let mut wo = WorkerOptions::new("pays");
    wo.num_handlers = 1;
    wo.interval = Duration::from_millis(20);
    let worker = new_worker(store.clone(), Arc::new(Pays), wo).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    // One handler, three waiting jobs: waiting holds no slot.
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.count("queued").await < 3 || waiting_count(&db).await < 3 {
        assert!(Instant::now() < deadline, "the jobs did not all wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in &ids {
        signals.send(*id, "paid", json!(true), None).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.count("completed").await < 3 {
        assert!(Instant::now() < deadline, "signalled jobs did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    run.await.unwrap();
}

async fn waiting_count(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE awaiting = 'paid'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// A workflow task may wait on a signal: `approve` (after `build`) waits,
/// holding its dependent `ship` back, until its signal comes; then both run,
/// in order, each once.
#[tokio::test]
async fn a_workflow_task_waits_for_its_signal_and_its_dependent_after_it() {
    use dbworker::workflow::{Task, Workflow, Workflows};
    struct Approves;
    impl workerutil::Handler<DbStore<Job>> for Approves {
        async fn handle(
            &self,
            job: &mut dbworker::DbJob<Job>,
            ctx: &workerutil::JobContext<DbStore<Job>>,
        ) -> Result<(), workerutil::HandlerError> {
            if job.record().payload["step"] == json!("approve")
                && job
                    .signal::<Value>(ctx.store(), "approved")
                    .await?
                    .is_none()
            {
                return Err(workerutil::HandlerError::wait_for("approved", HOUR));
            }
            Ok(())
        }
    }
    let db = Db::new().await;
    db.execute(&dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let table = db
        .table_with(|o| {
            o.signals = true;
            o.workflows = true;
        })
        .await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let step = |name: &str| dbworker::NewJob::new().json("payload", json!({ "step": name }));
    let wf = Workflow::new()
        .task(Task::new("build", step("build")))
        .task(Task::new("approve", step("approve")).after(["build"]))
        .task(Task::new("ship", step("ship")).after(["approve"]));
    let enqueued = workflows.enqueue(&wf).await.unwrap();
    let (approve, ship) = (
        enqueued.id_of("approve").unwrap(),
        enqueued.id_of("ship").unwrap(),
    );
    let mut o = db.options();
    o.stall.stalled_max_age = Duration::from_secs(60);
    let store = Arc::new(DbStore::new(&db.pool, &table, o).await.unwrap());
    let mut wo = WorkerOptions::new("approvals");
    wo.num_handlers = 2;
    wo.interval = Duration::from_millis(20);
    let worker = new_worker(store, Arc::new(Approves), wo).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting(&db, approve).await.1.as_deref() != Some("approved") {
        assert!(Instant::now() < deadline, "approve never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(db.state(ship).await, "pending", "ship waits for approve");
    let signals = dbworker::Signals::new(&db.pool, &table).await.unwrap();
    assert!(
        signals
            .send(approve, "approved", json!(true), None)
            .await
            .unwrap()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.state(ship).await != "completed" {
        assert!(Instant::now() < deadline, "ship never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    run.await.unwrap();
    let in_order: bool = sqlx::query_scalar(
        "SELECT (SELECT finished_at FROM jobs WHERE id = $1) <= (SELECT started_at FROM jobs WHERE id = $2)",
    )
    .bind(approve)
    .bind(ship)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(in_order, "ship started after approve finished");
    assert_eq!(db.count("completed").await, 3);
}

/// `<table>_signal_key` locks the job holding the key and checks the key
/// again: a sender that found the old holder while another transaction moved
/// the key to a new job, and waited for its row, signals the new holder once
/// that transaction commits (it signalled the old one, which no longer held
/// the key).
#[tokio::test]
async fn a_signal_by_key_reaches_the_job_holding_the_key_when_it_lands() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.keys = true,
        &[dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap()],
    )
    .await;
    let old: i64 =
        sqlx::query_scalar("INSERT INTO jobs (payload, job_key) VALUES ('{}', 'k') RETURNING id")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let mut moving = db.pool.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET job_key = NULL WHERE id = $1")
        .bind(old)
        .execute(&mut *moving)
        .await
        .unwrap();
    let new: i64 =
        sqlx::query_scalar("INSERT INTO jobs (payload, job_key) VALUES ('{}', 'k') RETURNING id")
            .fetch_one(&mut *moving)
            .await
            .unwrap();
    let pool = db.pool.clone();
    let send = tokio::spawn(async move {
        sqlx::query_scalar::<_, bool>("SELECT jobs_signal_key('k', 'paid')")
            .fetch_one(&pool)
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%jobs_signal_key%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sender never waited for the row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    moving.commit().await.unwrap();
    assert!(send.await.unwrap().unwrap());
    let to: Vec<i64> = sqlx::query_scalar("SELECT job_id FROM jobs_signals")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(to, [new], "the old holder was {old}");
}

/// In transactional handling a wait commits the handler's transaction, also
/// when a reported progress value was still waiting for the attempt's end:
/// that value is written in the same transaction (it rolled the handler's
/// writes back, then wrote the value and the wait on their own).
#[tokio::test]
async fn a_transactional_wait_with_a_report_pending_keeps_the_handlers_writes() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.progress = true,
        &[
            dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap(),
            "CREATE TABLE written (job_id bigint)".into(),
        ],
    )
    .await;
    let table = db
        .table_with(|o| {
            o.signals = true;
            o.progress = true;
        })
        .await;
    let mut o = db.options();
    o.handling = Handling::Transactional;
    o.stall.stalled_max_age = Duration::from_secs(60);
    let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim_one(&store).await;
    sqlx::query("INSERT INTO written VALUES ($1)")
        .bind(id)
        .execute(job.tx().expect("the job's transaction"))
        .await
        .unwrap();
    job.report_progress(&store, json!({"step": 3})).unwrap();
    assert!(store.mark_waiting(&mut job, "paid", HOUR).await.unwrap());
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM written")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(written, 1, "the handler's write committed with the wait");
    let progress: Option<Value> = sqlx::query_scalar("SELECT progress FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(progress, Some(json!({"step": 3})));
    assert_eq!(waiting(&db, id).await.1.as_deref(), Some("paid"));
}

/// `<table>_signal_key` finds the job by `job_key`: a table keyed by
/// another column is told so by `send_to_key`, naming it, rather than
/// "no such job" for every key.
#[tokio::test]
async fn a_signal_by_key_on_a_table_keyed_by_another_column_is_refused_by_name() {
    let db = Db::new().await;
    db.add_columns(
        |_| {},
        &[
            dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap(),
            "ALTER TABLE jobs ADD COLUMN dedupe_key text; \
             CREATE UNIQUE INDEX jobs_dedupe_key ON jobs (dedupe_key) \
             WHERE state IN ('queued', 'errored', 'processing')"
                .to_owned(),
        ],
    )
    .await;
    let table = db
        .table_with(|o| {
            o.signals = true;
            o.key_column = Some("dedupe_key".into());
        })
        .await;
    let signals = dbworker::Signals::new(&db.pool, &table).await.unwrap();
    let err = signals
        .send_to_key("k", "paid", serde_json::Value::Null, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("finds the job by its job_key column") && err.contains("dedupe_key"),
        "{err}"
    );
}
