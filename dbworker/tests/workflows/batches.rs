//! Batches with callbacks on real Postgres: each callback runs exactly once in
//! its situation and never in the others, however the batch's completions and
//! failures race across workers, and sees the batch's counts.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dbworker::{
    DbJob, DbStore, Handling, NewJob, StoreOptions,
    ddl::workflows_sql,
    new_worker,
    workflow::{Batch, BatchCounts, Batches, EnqueuedBatch},
};
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext, ShutdownHandle, WorkerOptions};

use common::{Db, Job};

/// Records each run in `side_effects`; a callback (payload `{"callback": …}`)
/// records its batch's counts as it sees them. Fails, for good, the jobs whose
/// payload says `"fail": true`.
struct Recorder {
    pool: sqlx::PgPool,
    batches: Batches,
}
impl Handler<DbStore<Job>> for Recorder {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let payload = job.record().payload.clone();
        let note = if payload.get("callback").is_some() {
            // The callback finds its batch by its own `workflow_id`.
            let batch: i64 = sqlx::query_scalar("SELECT workflow_id FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
            let c = self
                .batches
                .counts(batch)
                .await
                .map_err(|e| HandlerError::retryable(e.to_string()))?;
            format!(
                "total={} completed={} failed={} canceled={}",
                c.total, c.completed, c.failed, c.canceled
            )
        } else {
            "ran".to_owned()
        };
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, $2)")
            .bind(id)
            .bind(note)
            .execute(&self.pool)
            .await?;
        if payload["fail"] == json!(true) {
            return Err(HandlerError::non_retryable("told to fail"));
        }
        Ok(())
    }
}

async fn set_up() -> (Db, Batches) {
    let db = Db::new().await;
    let ddl = workflows_sql("jobs", &HashMap::new()).unwrap();
    // Twice: the migration is safe to run again (its policy check is replaced).
    db.execute(&ddl).await;
    db.execute(&ddl).await;
    let table = db.table_with(|t| t.workflows = true).await;
    let batches = Batches::new(&db.pool, &table).await.unwrap();
    (db, batches)
}

/// Runs `workers` workers of `handlers` handlers each, alternating handling
/// modes, each on a pool of its own, until no job is pending, queued, errored
/// or processing.
async fn run_until_done(db: &Db, batches: &Batches, workers: usize, handlers: usize) {
    let table = db.table().await;
    let mut shutdowns: Vec<ShutdownHandle> = Vec::new();
    let mut runs = Vec::new();
    for n in 0..workers {
        let mut o: StoreOptions = Db::options_for_tests();
        o.handling = if n % 2 == 0 {
            Handling::Heartbeat
        } else {
            Handling::Transactional
        };
        o.stall.stalled_max_age = Duration::from_secs(30);
        let pool = db
            .db
            .pool(u32::try_from(handlers).unwrap() + 4)
            .await
            .unwrap();
        let store = Arc::new(DbStore::new(&pool, &table, o).await.unwrap());
        let mut wo = WorkerOptions::new(format!("process-{n}"));
        wo.num_handlers = handlers;
        wo.interval = Duration::from_millis(10);
        let handler = Recorder {
            pool: db.pool.clone(),
            batches: batches.clone(),
        };
        let worker = new_worker(store, handler, wo).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    db.wait_until_no_live_job(Duration::from_secs(120)).await;
    for s in &shutdowns {
        s.graceful();
    }
    for run in runs {
        run.await.unwrap();
    }
}

fn job(fail: bool) -> NewJob {
    NewJob::new().json("payload", json!({ "fail": fail }))
}

fn callback(name: &str) -> NewJob {
    NewJob::new().json("payload", json!({ "callback": name }))
}

fn with_callbacks(batch: Batch) -> Batch {
    batch
        .on_success(callback("on_success"))
        .on_failure(callback("on_failure"))
        .on_complete(callback("on_complete"))
}

/// The notes job `id` wrote, one per run.
async fn notes(db: &Db, id: i64) -> Vec<String> {
    sqlx::query_scalar("SELECT note FROM side_effects WHERE job_id = $1")
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

fn counts_note(total: u64, completed: u64, failed: u64, canceled: u64) -> String {
    format!("total={total} completed={completed} failed={failed} canceled={canceled}")
}

#[tokio::test]
async fn callbacks_wait_pending_and_the_jobs_are_queued() {
    let (db, batches) = set_up().await;
    let b = batches
        .enqueue(&with_callbacks(
            Batch::new().jobs((0..3).map(|_| job(false))),
        ))
        .await
        .unwrap();
    assert_eq!(b.jobs.len(), 3);
    for id in &b.jobs {
        assert_eq!(db.state(*id).await, "queued");
    }
    for id in [b.on_success, b.on_failure, b.on_complete] {
        assert_eq!(db.state(id.unwrap()).await, "pending");
    }
    let edges: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(edges, 9, "each callback waits for each job");
    let c: BatchCounts = batches.counts(b.id).await.unwrap();
    assert_eq!((c.total, c.completed, c.failed, c.canceled), (3, 0, 0, 0));
    assert_eq!(c.unfinished(), 3);
    assert!(batches.enqueue(&Batch::new()).await.is_err(), "no job");
}

/// 30 batches of 12 jobs over 4 workers of 8 handlers: a third with no
/// failure, a third with one, a third with four failing at about the same
/// time. Each callback runs exactly once where it should and never elsewhere.
#[tokio::test]
async fn each_callback_runs_exactly_once_in_its_situation_across_workers() {
    let (db, batches) = set_up().await;
    let mut enqueued: Vec<(usize, EnqueuedBatch)> = Vec::new();
    for b in 0..30 {
        let failing = [0, 1, 4][b % 3];
        let batch = Batch::new().jobs((0..12).map(|i| job(i < failing)));
        enqueued.push((
            failing,
            batches.enqueue(&with_callbacks(batch)).await.unwrap(),
        ));
    }
    run_until_done(&db, &batches, 4, 8).await;
    for (failing, b) in &enqueued {
        let failing = *failing as u64;
        let (success, failure, complete) = (
            b.on_success.unwrap(),
            b.on_failure.unwrap(),
            b.on_complete.unwrap(),
        );
        let at_end = counts_note(12, 12 - failing, failing, 0);
        assert_eq!(
            notes(&db, complete).await,
            vec![at_end.clone()],
            "on_complete"
        );
        assert_eq!(db.state(complete).await, "completed");
        if failing == 0 {
            assert_eq!(notes(&db, success).await, vec![at_end], "on_success");
            assert_eq!(db.state(success).await, "completed");
            assert!(notes(&db, failure).await.is_empty(), "on_failure never ran");
            assert_eq!(db.state(failure).await, "canceled");
        } else {
            assert!(notes(&db, success).await.is_empty(), "on_success never ran");
            assert_eq!(db.state(success).await, "canceled");
            let seen = notes(&db, failure).await;
            assert_eq!(seen.len(), 1, "on_failure ran once: {seen:?}");
            assert_eq!(db.state(failure).await, "completed");
            // It runs at the first failure: at least that one is counted.
            let failed_seen: u64 = seen[0]
                .split("failed=")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=failing).contains(&failed_seen), "{}", seen[0]);
        }
        for id in &b.jobs {
            assert_eq!(notes(&db, *id).await.len(), 1, "job {id} ran once");
        }
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Only the success callbacks' edges to the failed jobs stay (so that a
    // retry of those brings the callback back).
    assert_eq!(
        left,
        10 + 10 * 4,
        "ten batches with one failed job, ten with four"
    );
}

/// The first failure releases on_failure at once, before the other jobs end;
/// later failures do not release it again.
#[tokio::test]
async fn on_failure_is_released_by_the_first_failure_only() {
    let (db, batches) = set_up().await;
    let b = batches
        .enqueue(&with_callbacks(
            Batch::new().jobs((0..3).map(|_| job(false))),
        ))
        .await
        .unwrap();
    let fail = |id: i64| {
        sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
    };
    fail(b.jobs[0]).await.unwrap();
    let failure = b.on_failure.unwrap();
    assert_eq!(db.state(failure).await, "queued", "released at once");
    assert_eq!(db.state(b.on_success.unwrap()).await, "canceled");
    assert_eq!(db.state(b.on_complete.unwrap()).await, "pending");
    // The callback is taken and finished before the second failure.
    sqlx::query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1")
        .bind(failure)
        .execute(&db.pool)
        .await
        .unwrap();
    fail(b.jobs[1]).await.unwrap();
    assert_eq!(db.state(failure).await, "completed", "not released again");
    assert_eq!(db.state(b.on_complete.unwrap()).await, "pending");
    sqlx::query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1")
        .bind(b.jobs[2])
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(db.state(failure).await, "completed");
    assert_eq!(db.state(b.on_complete.unwrap()).await, "queued");
    let c = batches.counts(b.id).await.unwrap();
    assert_eq!((c.total, c.completed, c.failed, c.canceled), (3, 1, 2, 0));
}

/// A canceled job is not a failure: on_failure and on_success are canceled,
/// on_complete runs and counts it.
#[tokio::test]
async fn a_canceled_job_runs_only_on_complete() {
    let (db, batches) = set_up().await;
    let b = batches
        .enqueue(&with_callbacks(
            Batch::new().jobs((0..4).map(|_| job(false))),
        ))
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET state = 'canceled', finished_at = now() WHERE id = $1")
        .bind(b.jobs[3])
        .execute(&db.pool)
        .await
        .unwrap();
    run_until_done(&db, &batches, 2, 4).await;
    let (success, failure, complete) = (
        b.on_success.unwrap(),
        b.on_failure.unwrap(),
        b.on_complete.unwrap(),
    );
    assert_eq!(db.state(success).await, "canceled");
    assert_eq!(db.state(failure).await, "canceled");
    assert!(notes(&db, success).await.is_empty());
    assert!(notes(&db, failure).await.is_empty());
    assert_eq!(notes(&db, complete).await, vec![counts_note(4, 3, 0, 1)]);
}

/// Many completions of one batch race: 40 connections start together and
/// each finishes 5 of its 200 jobs in one transaction; the
/// on_success and on_complete callbacks are each queued exactly once, and
/// on_failure canceled.
#[tokio::test]
async fn simultaneous_completions_release_each_callback_once() {
    let (db, batches) = set_up().await;
    let b = batches
        .enqueue(&with_callbacks(
            Batch::new().jobs((0..200).map(|_| job(false))),
        ))
        .await
        .unwrap();
    let pool = db.db.pool(40).await.unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let mut tasks = Vec::new();
    for chunk in b.jobs.chunks(5) {
        let (pool, barrier, ids) = (pool.clone(), barrier.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            barrier.wait().await;
            for id in ids {
                sqlx::query(
                    "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(db.state(b.on_success.unwrap()).await, "queued");
    assert_eq!(db.state(b.on_complete.unwrap()).await, "queued");
    assert_eq!(db.state(b.on_failure.unwrap()).await, "canceled");
    run_until_done(&db, &batches, 2, 4).await;
    let all = counts_note(200, 200, 0, 0);
    assert_eq!(notes(&db, b.on_success.unwrap()).await, vec![all.clone()]);
    assert_eq!(notes(&db, b.on_complete.unwrap()).await, vec![all]);
    assert!(notes(&db, b.on_failure.unwrap()).await.is_empty());
}
