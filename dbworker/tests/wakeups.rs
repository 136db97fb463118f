//! LISTEN/NOTIFY wake-ups on real Postgres: an idle worker starts a new job at
//! once instead of at its next poll, and the listener comes back by itself
//! after its backend is terminated or the server restarts.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{DbStore, Handling, Listen, ddl::notify_trigger_sql, new_worker};
use serde_json::json;
use workerutil::testing::wait_for;
use workerutil::{Store, WorkerEvent, WorkerOptions};

use common::{Completes, Db, Job};
use dbworker_testkit::ThrowawayServer;

/// Polls so rarely that a job found within a second was found by a wake-up.
const SLOW_POLL: Duration = Duration::from_secs(20);

async fn listening_store(db: &Db) -> Arc<DbStore<Job>> {
    let ddl = notify_trigger_sql("jobs", &Default::default(), None).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.listen = Listen::TableChannel;
    let store = db.store_on(&db.table().await, o).await;
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
