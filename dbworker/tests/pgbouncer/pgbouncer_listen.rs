//! LISTEN behind PgBouncer in transaction mode: with `listen_url` set, the
//! listener's session goes straight to the server while every statement goes
//! through PgBouncer, and an idle worker that polls every 20 s starts a job
//! enqueued through PgBouncer at once (woken by its NOTIFY). Without
//! `listen_url`, the store says once in the log that it polls, LISTENs
//! nowhere, and its workers still find every job at their poll. Skipped,
//! saying why, without pgbouncer (.ci/run installs it).

use crate::common;

use dbworker_testkit::pgbouncer as bouncer;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dbworker::{
    DbStore, Enqueuer, Handling, JobTable, Listen, NewJob, Pooler, ddl::notify_trigger_sql,
    new_worker,
};
use workerutil::testing::wait_for;
use workerutil::{Store, WorkerEvent, WorkerOptions};

use crate::POOLER;
use bouncer::Bouncer;
use common::{Completes, Db, Job};

/// Polls so rarely that a job found within a few seconds was found by a wake-up.
const SLOW_POLL: Duration = Duration::from_secs(20);

/// The application name the listener's direct session carries.
const LISTENER_NAME: &str = "dbworker_direct_listener";

/// Everything the tests' processes logged.
fn logs() -> &'static common::LogLines {
    static LOGS: OnceLock<common::LogLines> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = common::LogLines::default();
        let writer = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init();
        logs
    })
}

/// The job table with its notify trigger, PgBouncer in front, and a store on
/// a pool through it that asks to listen.
async fn set_up(test: &str) -> Option<(Db, Bouncer, sqlx::PgPool)> {
    // The other tests of this binary log here too: each test reads only its own lines.
    logs().clear();
    let db = Db::new().await;
    let bouncer = Bouncer::start_or_skip(test, db.db.url(), 4)?;
    db.execute(&notify_trigger_sql("jobs", &Default::default(), None).unwrap())
        .await;
    let pool = bouncer.pool(8).await;
    Some((db, bouncer, pool))
}

async fn listening_store(pool: &sqlx::PgPool) -> Arc<DbStore<Job>> {
    let table = JobTable::new(pool, Db::table_options()).await.unwrap();
    let mut o = Db::options_for_tests();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.listen = Listen::TableChannel;
    Arc::new(DbStore::new(pool, &table, o).await.unwrap())
}

fn options(interval: Duration) -> WorkerOptions {
    let mut o = WorkerOptions::new("behind-pgbouncer");
    o.interval = interval;
    o.max_interval = Some(interval * 3);
    o.heartbeat_interval = Duration::from_millis(500);
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    o
}

/// The server sessions running LISTEN, by application name.
async fn listening_sessions(db: &Db) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Enqueues a job through PgBouncer once the worker is idle; returns how
/// long the worker took to start it.
async fn time_to_start(
    enqueuer: &Enqueuer,
    events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>,
) -> Duration {
    wait_for(events, |e| {
        matches!(e, WorkerEvent::Idle | WorkerEvent::JobFinished { .. }).then_some(())
    })
    .await;
    let start = Instant::now();
    let id = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    wait_for(events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: got } if *got == id).then_some(())
    })
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_listen_url_a_worker_behind_pgbouncer_is_woken_by_notify() {
    let _turn = POOLER.lock().await;
    let Some((db, bouncer, pool)) = set_up("LISTEN via listen_url").await else {
        return;
    };
    let url = db.db.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    dbworker::set_pooler(Pooler::Transaction {
        listen_url: Some(format!("{url}{sep}application_name={LISTENER_NAME}")),
    });
    let store = listening_store(&pool).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.wakeups().is_some_and(|w| w.is_live()) {
        assert!(Instant::now() < deadline, "the listener never went live");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        listening_sessions(&db).await,
        vec![LISTENER_NAME.to_owned()],
        "one LISTEN session, on the direct connection"
    );

    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let enqueuer = Enqueuer::new(&pool, &table).await.unwrap();
    let worker = new_worker(store, Completes, options(SLOW_POLL)).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..3 {
        let took = time_to_start(&enqueuer, &mut events).await;
        assert!(
            took < SLOW_POLL / 4,
            "woken by NOTIFY, not the poll: {took:?}"
        );
    }
    shutdown.graceful();
    run.await.unwrap();
    assert_eq!(db.count("completed").await, 3);
    let log = bouncer.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_url_the_store_says_it_polls_and_still_runs_every_job() {
    let _turn = POOLER.lock().await;
    let Some((db, _bouncer, pool)) = set_up("the polling fallback").await else {
        return;
    };
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let store = listening_store(&pool).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let said = "LISTEN needs a session, which a transaction pooler does not keep: workers poll";
    while !logs().text().contains(said) {
        assert!(
            Instant::now() < deadline,
            "no log line says the store polls"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !store.wakeups().is_some_and(|w| w.is_live()),
        "no live wake-ups without a session"
    );
    assert!(
        listening_sessions(&db).await.is_empty(),
        "nothing LISTENs through a transaction pooler"
    );
    db.enqueue(5, serde_json::json!({})).await;
    let mut o = options(Duration::from_millis(50));
    o.num_total_jobs = Some(5);
    new_worker(store, Completes, o).unwrap().run().await;
    assert_eq!(db.count("completed").await, 5, "found by polling");
}

/// `url` with its database replaced by `db`.
fn on_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    if query.is_empty() {
        format!("{server}/{db}")
    } else {
        format!("{server}/{db}?{query}")
    }
}

/// NOTIFY is per database: a `listen_url` naming another database than the
/// pool's is refused at start-up naming both, and one nobody answers at is
/// refused naming its address, not after a silent wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_url_on_another_database_or_a_closed_port_is_refused_at_start_up() {
    let _turn = POOLER.lock().await;
    let Some((db, _bouncer, pool)) = set_up("listen_url checks").await else {
        return;
    };
    // Whichever test of this binary ran before, the pool is behind PgBouncer.
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut o = Db::options_for_tests();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.listen = Listen::TableChannel;
    let ours: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&db.pool)
        .await
        .unwrap();

    dbworker::set_pooler(Pooler::Transaction {
        listen_url: Some(on_database(db.db.url(), "postgres")),
    });
    let Err(err) = DbStore::<Job>::new(&pool, &table, o.clone()).await else {
        panic!("refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("listen_url") && err.contains("\"postgres\"") && err.contains(&ours),
        "{err}"
    );

    dbworker::set_pooler(Pooler::Transaction {
        listen_url: Some("postgres://nobody@127.0.0.1:1/app".into()),
    });
    let Err(err) = DbStore::<Job>::new(&pool, &table, o.clone()).await else {
        panic!("refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("listen_url") && err.contains("127.0.0.1:1"),
        "{err}"
    );

    // The pool's own database is accepted.
    dbworker::set_pooler(Pooler::Transaction {
        listen_url: Some(db.db.url().to_owned()),
    });
    let store = DbStore::<Job>::new(&pool, &table, o).await.unwrap();
    store.close().await;
}
