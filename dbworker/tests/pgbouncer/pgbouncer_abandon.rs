//! Transactional jobs stopped mid-query behind PgBouncer in transaction mode,
//! a pooler another program shares: every stuck job is handed back at once,
//! its server session ended, and neither the worker's pool nor the pooler's
//! server connections starve (a shutdown abandons every job at the same
//! moment), nor is a connection whose `BEGIN` waited in the pooler's queue
//! when its statement timed out handed back inside that transaction.
//! Skipped, saying why, without pgbouncer (.ci/run installs it).

use crate::common;
use crate::fixtures::stuck::{Stuck, released};

use dbworker::{DbJob, DbStore, Handling, JobTable, Pooler, new_worker};
use dbworker_testkit::pgbouncer::Bouncer;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

use crate::POOLER;
use common::{Db, Job};

const HANDLERS: u32 = 3;

/// Completes at once.
struct Done;
impl Handler<DbStore<Job>> for Done {
    async fn handle(
        &self,
        _job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn options(name: &str) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = HANDLERS as usize;
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o.drain_timeout = Duration::from_secs(1);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_stopped_mid_query_behind_a_shared_pgbouncer_are_handed_back_and_starve_nobody() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    // As many server connections as handlers: the stuck jobs hold them all.
    let Some(bouncer) = Bouncer::start_or_skip("the PgBouncer abandon test", db.db.url(), HANDLERS)
    else {
        return;
    };
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let pool = bouncer.pool(HANDLERS + 2).await;
    let other = bouncer.pool(2).await;
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Transactional;
    let store = Arc::new(DbStore::new(&pool, &table, so.clone()).await.unwrap());
    let ids = db.enqueue(HANDLERS as usize, json!({})).await;

    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    // No claim beyond the stuck jobs: a claim waiting in the pooler's queue
    // when the shutdown drops it would still land, as after a crash.
    let mut o = options("stuck");
    o.num_total_jobs = Some(HANDLERS as u64);
    let worker = new_worker(store, Stuck(started), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    for _ in 0..HANDLERS {
        starts.recv().await.expect("every handler starts");
    }
    let since = Instant::now();
    shutdown.graceful();
    tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the shutdown waited for the stuck queries: {}",
                bouncer.log()
            )
        })
        .unwrap();
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    for id in &ids {
        assert_eq!(db.state(*id).await, "queued", "handed back, not charged");
    }
    assert!(
        released(&db, &ids).await,
        "the stuck server sessions were ended"
    );
    // Heartbeats timed out while their `BEGIN` waited in the pooler's queue:
    // no connection was handed back inside a transaction, where the marks
    // above would have been written and never committed.
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(open, 0, "sessions left in a transaction");

    // The other program and the next worker are served at once.
    let answered = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&other),
    )
    .await;
    assert!(matches!(answered, Ok(Ok(1))), "{answered:?}");
    let store = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let mut o = options("next");
    o.num_total_jobs = Some(HANDLERS as u64);
    tokio::time::timeout(
        Duration::from_secs(10),
        new_worker(store, Done, o).unwrap().run(),
    )
    .await
    .expect("the worker's pool serves the next worker");
    for id in &ids {
        assert_eq!(db.state(*id).await, "completed");
    }
}
