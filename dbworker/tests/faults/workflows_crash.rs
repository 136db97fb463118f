//! Workflows when a worker process dies: SIGKILL a heartbeat-handling worker
//! (grouped marks) in the middle of 100 diamond workflows. The release runs in
//! the transaction of the completion that causes it, so there is no moment
//! between the two for a kill to split: jobs whose marks were lost go back to
//! the queue through the resetter and run again, their dependents stay
//! `pending` until then, and every dependent is released exactly once.

use crate::common;
use crate::fixtures::crash as shared;

use dbworker::{
    DbJob, DbStore, Handling, JobTable, JobTableOptions, NewJob, Resetter, ResetterOptions,
    ddl::workflows_sql,
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use std::collections::HashMap;
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext};

use crate::HEAVY;
use common::{Db, Job};
use shared::options;

const CHILD_ENV: &str = "DBWORKER_WORKFLOW_CRASH_CHILD_URL";

/// Records each run (with the database clock), then completes the job
/// through the grouped marks.
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
        // A little work per job, so the kill finds jobs in flight.
        tokio::time::sleep(Duration::from_millis(3)).await;
        Ok(())
    }
}

/// The test table with workflows: what the child, the workflows, the
/// resetter and the survivor all take.
fn table_options() -> JobTableOptions {
    let mut t = Db::table_options();
    t.workflows = true;
    t
}

fn store_options() -> dbworker::StoreOptions {
    let mut so = Db::options_for_tests();
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(2);
    so
}

/// The worker the test below kills.
#[tokio::test]
#[ignore = "run as a child process by a_worker_killed_mid_workflow_strands_and_repeats_no_release"]
async fn workflow_crash_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let table = JobTable::new(&pool, table_options()).await.unwrap();
    let store = std::sync::Arc::new(DbStore::new(&pool, &table, store_options()).await.unwrap());
    let mut o = options("doomed-workflows");
    o.num_handlers = 16;
    new_worker(store, Note { pool }, o).unwrap().run().await;
}

#[tokio::test]
async fn a_worker_killed_mid_workflow_strands_and_repeats_no_release() {
    let _alone = HEAVY.write().await;
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.execute(
        "ALTER TABLE side_effects ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp();
         CREATE TABLE releases (job_id bigint);
         CREATE FUNCTION count_release() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO releases VALUES (NEW.id); RETURN NULL; END $$;
         CREATE TRIGGER count_release AFTER UPDATE OF state ON jobs FOR EACH ROW
           WHEN (OLD.state = 'pending' AND NEW.state = 'queued') EXECUTE FUNCTION count_release();",
    )
    .await;
    let table = JobTable::new(&db.pool, table_options()).await.unwrap();
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    for _ in 0..100 {
        workflows
            .enqueue(
                &Workflow::new()
                    .task(Task::new("a", NewJob::new()))
                    .task(Task::new("b", NewJob::new()).after(["a"]))
                    .task(Task::new("c", NewJob::new()).after(["a"]))
                    .task(Task::new("d", NewJob::new()).after(["b", "c"])),
            )
            .await
            .unwrap();
    }
    // Kill it with the workflows half done: tasks running, buffered, and
    // being marked, dependents being released.
    let stranded = db
        .kill_worker_process(
            &common::test_path(module_path!(), "workflow_crash_child"),
            CHILD_ENV,
            150,
        )
        .await;
    assert!(db.count("pending").await > 0, "the kill came mid-workflow");

    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = Duration::from_secs(2);
    let out = Resetter::new(&db.pool, &table, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len() as i64, stranded, "{out:?}");

    let store = db.store_on(&table, store_options()).await;
    let mut o = options("survivor");
    o.num_handlers = 16;
    let worker = new_worker(
        store,
        Note {
            pool: db.pool.clone(),
        },
        o,
    )
    .unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    db.wait_until_no_live_job(Duration::from_secs(60)).await;
    shutdown.graceful();
    run.await.unwrap();

    assert_eq!(db.count("completed").await, 400, "no task stranded");
    let never_ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM side_effects s WHERE s.job_id = j.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(never_ran, 0);
    // b, c and d of each workflow were each released once.
    let (releases, released_jobs): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT job_id) FROM releases")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((releases, released_jobs), (300, 300));
    // No task ran, in any attempt, before every task it waits for had
    // finished for good (its last completion, the one that released it).
    let early: Vec<(i64, String)> = sqlx::query_as(
        "SELECT d.id, d.task_name FROM jobs d
           JOIN jobs u ON u.workflow_id = d.workflow_id
            AND (d.task_name IN ('b', 'c') AND u.task_name = 'a'
                 OR d.task_name = 'd' AND u.task_name IN ('b', 'c'))
          WHERE (SELECT min(s.at) FROM side_effects s WHERE s.job_id = d.id) < u.finished_at",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        early.is_empty(),
        "started before an upstream finished: {early:?}"
    );
    let edges_left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(edges_left, 0);
    let reran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id FROM side_effects GROUP BY job_id HAVING count(*) > 1) r",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eprintln!("{stranded} jobs stranded by the kill and requeued; {reran} ran twice");
}
