//! A worker process killed with SIGKILL with marks in flight: the resetter
//! requeues its stalled jobs and another worker completes every one. Killed
//! mid-job and rescued by the standalone resetter (`dbworker reset`):
//! dbworker-cli/tests/services/crash.rs.

use crate::common;
use crate::fixtures::crash as shared;

use dbworker::{DbJob, DbStore, Handling, JobTable, Resetter, ResetterOptions, new_worker};
use serde_json::json;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext};

use crate::HEAVY;
use common::{Db, Job};
use shared::options;

const GROUPED_CHILD_ENV: &str = "DBWORKER_CRASH_GROUPED_CHILD_URL";

/// Records each run of a job, then completes it (through the grouped marks).
struct Note {
    pool: sqlx::PgPool,
}
impl Handler<DbStore<Job>> for Note {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')")
            .bind(job.record().id)
            .execute(&self.pool)
            .await?;
        // A little work per job, so the kill always finds jobs in flight
        // however fast the worker gets.
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

/// A heartbeat-handling worker with grouped marks, killed by the test below.
#[tokio::test]
#[ignore = "run as a child process by a_worker_killed_with_marks_in_flight_loses_no_job"]
async fn crash_child_grouped_worker() {
    let Ok(url) = std::env::var(GROUPED_CHILD_ENV) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(2);
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let store = std::sync::Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let mut o = options("doomed-grouped");
    o.num_handlers = 16;
    new_worker(store, Note { pool }, o).unwrap().run().await;
}

#[tokio::test]
async fn a_worker_killed_with_marks_in_flight_loses_no_job() {
    let _alone = HEAVY.write().await;
    let db = Db::new().await;
    let ids = db.enqueue(3000, json!({})).await;
    kill_mid_stream_and_recover(&db, &ids).await;
}

/// The same crash on the HOT layout: the resetter finds the stranded jobs
/// through the live index, and the claims through it take every one back.
#[tokio::test]
async fn a_worker_killed_on_the_hot_layout_loses_no_job() {
    let _alone = HEAVY.write().await;
    let db = Db::hot().await;
    let ids = db.enqueue(3000, json!({})).await;
    kill_mid_stream_and_recover(&db, &ids).await;
}

/// The same crash on a table partitioned by day, its jobs queued over ten
/// days (ten partitions): the stranded jobs come back from every partition.
#[tokio::test]
async fn a_worker_killed_on_a_partitioned_table_loses_no_job() {
    let _alone = HEAVY.write().await;
    let db = Db::partitioned().await;
    let ids = db.enqueue_spread(3000, json!({})).await;
    assert_eq!(db.partitions_in_use().await, 10);
    kill_mid_stream_and_recover(&db, &ids).await;
    let emptied: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT tableoid) FROM jobs j WHERE EXISTS (SELECT 1 FROM side_effects s WHERE s.job_id = j.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(emptied, 10, "jobs ran in every partition");
}

/// Starts a grouped-mark worker as a child process, kills it with jobs in flight,
/// resets what it stranded and checks a new worker completes every job once.
async fn kill_mid_stream_and_recover(db: &Db, ids: &[i64]) {
    // Kill it mid-stream, while jobs are running, buffered and being marked.
    let stranded = db
        .kill_worker_process(
            &common::test_path(module_path!(), "crash_child_grouped_worker"),
            GROUPED_CHILD_ENV,
            200,
        )
        .await;

    // Stalled jobs go back to the queue; a new worker finishes everything.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = Duration::from_secs(2);
    let out = Resetter::new(&db.pool, &db.table().await, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len() as i64, stranded, "{out:?}");
    let store = db.store(Handling::Heartbeat).await;
    let mut o = options("survivor");
    o.num_handlers = 16;
    o.num_total_jobs = Some(db.count("queued").await as u64);
    new_worker(
        store,
        Note {
            pool: db.pool.clone(),
        },
        o,
    )
    .unwrap()
    .run()
    .await;
    assert_eq!(db.count("completed").await, ids.len() as i64, "no job lost");
    let never_ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM side_effects s WHERE s.job_id = j.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(never_ran, 0);
}
