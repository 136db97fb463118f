//! Results passed downstream on Postgres: a handler's result is stored with
//! its completion (both handling modes, single and grouped marks), a
//! dependent reads the results of the jobs it waited for by task name, the
//! size cap fails the job with a clear message, and a stale completion
//! writes nothing. And what a handler keeps while it runs: progress and
//! checkpoints, fenced, surviving retries and resets.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{
    DbJob, DbStore, Enqueuer, Error, Handling, JobTable, NewJob,
    ddl::workflows_sql,
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use serde_json::{Value, json};
use workerutil::{Handler, HandlerError, Job as _, JobContext, Store, WorkerOptions};

use common::{Db, Job};

/// Fails with `payload.fail` (after setting a result that must not be
/// stored); stores `payload.produce` as its result; with `payload.consume`, stores
/// the results of its upstream jobs instead; with `payload.big`, tries a
/// result of that many bytes and ignores the refusal.
struct Results;
impl Handler<DbStore<Job>> for Results {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let payload = job.record().payload.clone();
        if payload["fail"] == json!(true) {
            job.set_result(json!("never stored"))?;
            return Err(HandlerError::non_retryable("told to fail"));
        }
        if payload["consume"] == json!(true) {
            let upstream = job.upstream_results(ctx.store()).await?;
            let sorted: BTreeMap<String, Value> = upstream.into_iter().collect();
            job.set_result(json!(sorted))?;
        } else if let Some(n) = payload["big"].as_u64() {
            let refused = job.set_result(json!("x".repeat(usize::try_from(n).unwrap())));
            assert!(
                matches!(refused, Err(Error::ResultTooLarge { .. })),
                "{refused:?}"
            );
        } else if !payload["produce"].is_null() {
            job.set_result(payload["produce"].clone())?;
        }
        Ok(())
    }
}

async fn set_up() -> Db {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.add_columns(|c| c.results = true, &[]).await;
    db
}

/// The test table with its result column.
async fn results_table(db: &Db) -> JobTable {
    db.table_with(|t| t.result_column = Some("result".into()))
        .await
}

/// The test table with workflows and results (which need `upstream_ids`).
async fn workflow_table(db: &Db) -> JobTable {
    db.table_with(|t| {
        t.workflows = true;
        t.result_column = Some("result".into());
    })
    .await
}

async fn store(db: &Db, handling: Handling, cap: usize) -> Arc<DbStore<Job>> {
    let mut o = db.options();
    o.handling = handling;
    o.max_result_bytes = cap;
    o.stall.stalled_max_age = Duration::from_secs(30);
    db.store_on(&results_table(db).await, o).await
}

async fn workflows(db: &Db) -> Workflows {
    Workflows::new(&db.pool, &workflow_table(db).await)
        .await
        .unwrap()
}

/// Runs a worker of 4 handlers until nothing is left to run.
async fn run(db: &Db, store: Arc<DbStore<Job>>) {
    let mut o = WorkerOptions::new("results");
    o.num_handlers = 4;
    o.interval = Duration::from_millis(10);
    let worker = new_worker(store, Results, o).unwrap();
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    db.wait_until_no_live_job(Duration::from_secs(60)).await;
    shutdown.graceful();
    running.await.unwrap();
}

async fn result(db: &Db, id: i64) -> Option<Value> {
    db.scalar("SELECT result FROM jobs WHERE id = $1", id).await
}

async fn diamond_passes_results_by_name(handling: Handling) {
    let db = set_up().await;
    let task = |name: &str, payload: Value| Task::new(name, NewJob::new().set("payload", payload));
    let wf = workflows(&db)
        .await
        .enqueue(
            &Workflow::new()
                .task(task("a", json!({ "produce": { "rows": 3 } })))
                .task(task("b", json!({ "produce": { "from": "b" } })).after(["a"]))
                .task(task("c", json!({ "produce": [1, 2, 3] })).after(["a"]))
                .task(task("d", json!({ "consume": true })).after(["b", "c"])),
        )
        .await
        .unwrap();
    run(&db, store(&db, handling, 64 * 1024).await).await;
    let id = |n: &str| wf.id_of(n).unwrap();
    for n in ["a", "b", "c", "d"] {
        assert_eq!(db.state(id(n)).await, "completed", "{handling:?}: {n}");
    }
    assert_eq!(result(&db, id("a")).await, Some(json!({ "rows": 3 })));
    assert_eq!(
        result(&db, id("d")).await,
        Some(json!({ "b": { "from": "b" }, "c": [1, 2, 3] })),
        "{handling:?}: d read the results of b and c (not a), by name"
    );
}

#[tokio::test]
async fn a_diamond_passes_results_by_name_in_heartbeat_handling() {
    diamond_passes_results_by_name(Handling::Heartbeat).await;
}

#[tokio::test]
async fn a_diamond_passes_results_by_name_in_transactional_handling() {
    diamond_passes_results_by_name(Handling::Transactional).await;
}

#[tokio::test]
async fn a_dependent_of_existing_jobs_reads_their_results_by_id() {
    let db = set_up().await;
    let enqueuer = Enqueuer::new(&db.pool, &workflow_table(&db).await)
        .await
        .unwrap();
    let first = db.enqueue(1, json!({ "produce": "done early" })).await[0];
    run(&db, store(&db, Handling::Heartbeat, 1024).await).await;
    // One upstream already completed, one still queued.
    let second = db.enqueue(1, json!({ "produce": 2 })).await[0];
    let dependent = enqueuer
        .enqueue(
            &NewJob::new()
                .set("payload", json!({ "consume": true }))
                .after([first, second]),
        )
        .await
        .unwrap()
        .id();
    run(&db, store(&db, Handling::Transactional, 1024).await).await;
    assert_eq!(
        result(&db, dependent).await,
        Some(json!({ first.to_string(): "done early", second.to_string(): 2 }))
    );
}

#[tokio::test]
async fn a_result_over_the_cap_fails_the_job_naming_size_and_cap() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = set_up().await;
        let big = db.enqueue(1, json!({ "big": 100 })).await[0];
        let small = db.enqueue(1, json!({ "produce": "ok" })).await[0];
        run(&db, store(&db, handling, 64).await).await;
        assert_eq!(db.state(big).await, "failed", "{handling:?}");
        let message: String = db
            .scalar("SELECT failure_message FROM jobs WHERE id = $1", big)
            .await;
        assert!(
            message.contains("102 bytes") && message.contains("cap of 64 bytes"),
            "{handling:?}: {message}"
        );
        assert_eq!(result(&db, big).await, None);
        assert_eq!(db.state(small).await, "completed");
        assert_eq!(result(&db, small).await, Some(json!("ok")));
    }
}

#[tokio::test]
async fn a_stale_completion_writes_no_result() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = set_up().await;
        let id = db.enqueue(1, json!({})).await[0];
        let store = store(&db, handling, 1024).await;
        let mut stale = store.dequeue("a", &Default::default(), 1).await.unwrap();
        db.age_heartbeats().await;
        store.reset_stalled().await.unwrap();
        let mut fresh = store.dequeue("b", &Default::default(), 1).await.unwrap();
        assert!(store.open(&mut fresh[0]).await.unwrap());

        stale[0].set_result(json!("stale")).unwrap();
        assert!(!store.mark_complete(&mut stale[0]).await.unwrap());
        assert_eq!(result(&db, id).await, None, "{handling:?}");
        fresh[0].set_result(json!("fresh")).unwrap();
        assert!(store.mark_complete(&mut fresh[0]).await.unwrap());
        assert_eq!(result(&db, id).await, Some(json!("fresh")), "{handling:?}");
    }
}

#[tokio::test]
async fn results_need_the_column() {
    let db = Db::new().await;
    let mut t = Db::table_options();
    t.result_column = Some("result".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(
        err.contains("no column result (result_column)") && err.contains("--results"),
        "{err}"
    );
    // Without one, set_result is refused and says why.
    let store = db.store(Handling::Heartbeat).await;
    db.enqueue(1, json!({})).await;
    let mut jobs = store.dequeue("w", &Default::default(), 1).await.unwrap();
    let err = jobs[0].set_result(json!(1)).unwrap_err().to_string();
    assert!(err.contains("result_column"), "{err}");
}

/// Completions and failures finishing together share a grouped mark (the
/// statement for mixed groups): each completion keeps its own result, and a
/// failure stores none.
#[tokio::test]
async fn mixed_groups_store_each_completions_result() {
    let db = set_up().await;
    let mut ids = Vec::new();
    for n in 0..60 {
        let payload = if n % 3 == 0 {
            json!({ "fail": true })
        } else {
            json!({ "produce": n })
        };
        ids.push((n, db.enqueue(1, payload).await[0]));
    }
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(30);
    let store = db.store_on(&results_table(&db).await, o).await;
    let mut wo = WorkerOptions::new("mixed");
    wo.num_handlers = 16;
    wo.interval = Duration::from_millis(10);
    wo.num_total_jobs = Some(60);
    new_worker(store, Results, wo).unwrap().run().await;
    // The last grouped marks may still be in flight when the worker returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count("processing").await > 0 {
        assert!(Instant::now() < deadline, "marks never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (n, id) in ids {
        if n % 3 == 0 {
            assert_eq!(db.state(id).await, "failed", "{n}");
            assert_eq!(result(&db, id).await, None, "{n}");
        } else {
            assert_eq!(db.state(id).await, "completed", "{n}");
            assert_eq!(result(&db, id).await, Some(json!(n)), "{n}");
        }
    }
}

/// A dependent made to wait from SQL (`jobs_wait_for`) reads its upstream
/// results as one added through `NewJob::after` does.
#[tokio::test]
async fn a_dependent_added_from_sql_reads_its_upstream_results() {
    let db = set_up().await;
    let first = db.enqueue(1, json!({ "produce": "from sql" })).await[0];
    let mut tx = db.pool.begin().await.unwrap();
    let dependent: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (payload) VALUES ('{\"consume\": true}') RETURNING id",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let state: String = sqlx::query_scalar("SELECT jobs_wait_for($1, $2)")
        .bind(dependent)
        .bind(vec![first])
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state, "pending");
    run(&db, store(&db, Handling::Heartbeat, 1024).await).await;
    assert_eq!(
        result(&db, dependent).await,
        Some(json!({ first.to_string(): "from sql" }))
    );
}

/// Where the test table keeps progress and checkpoints: its own columns
/// (`migration --progress`) or the side table `jobs_progress`
/// (`--progress-table`). Every progress test runs on both.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Storage {
    Columns,
    Side,
}

/// One `#[tokio::test]` per storage for the test body `$name(storage)`.
macro_rules! on_both_storages {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn columns() {
                super::$name(super::Storage::Columns).await
            }
            #[tokio::test]
            async fn side_table() {
                super::$name(super::Storage::Side).await
            }
        }
    )*};
}

on_both_storages!(
    a_checkpoint_survives_retries_and_resets_and_completion_drops_it,
    a_transactional_checkpoint_commits_with_the_handlers_writes,
    oversized_or_nul_progress_is_refused_and_a_table_without_it_is_named,
    reported_progress_rides_on_the_heartbeat,
    a_write_that_lost_to_another_is_refused,
    the_last_reported_progress_survives_completion_error_and_snooze,
    a_report_a_beat_wrote_leaves_the_attempts_next_write_accepted,
    a_completion_grouped_with_failures_drops_its_checkpoint,
    a_beat_given_up_that_commits_after_a_newer_write_changes_nothing,
    an_operators_completion_drops_the_checkpoint_as_a_workers_does,
);

/// The test table keeping progress in `storage`, found by `JobTable::new`.
async fn progress_table(storage: Storage) -> (Db, JobTable) {
    let db = Db::new().await;
    match storage {
        Storage::Columns => db.add_columns(|c| c.progress = true, &[]).await,
        Storage::Side => {
            db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
                .await
        }
    }
    let table = db.table_with(|o| o.progress = true).await;
    assert!(table.has_progress());
    let columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'jobs' AND column_name = 'progress'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(columns, i64::from(storage == Storage::Columns));
    (db, table)
}

/// The test table keeping progress in `storage`, and a store over it.
async fn progress_store(handling: Handling, storage: Storage) -> (Db, DbStore<Job>) {
    let (db, table) = progress_table(storage).await;
    let mut o = db.options();
    o.handling = handling;
    o.max_num_retries = 5;
    let store = DbStore::new(&db.pool, &table, o).await.unwrap();
    (db, store)
}

/// `(progress, checkpoint, progress_seq)` of job `id`, wherever kept (no
/// side row yet: none, none, 0).
async fn stored(db: &Db, storage: Storage, id: i64) -> (Option<Value>, Option<Value>, i64) {
    let sql = match storage {
        Storage::Columns => "SELECT progress, checkpoint, progress_seq FROM jobs WHERE id = $1",
        Storage::Side => {
            "SELECT s.progress, s.checkpoint, COALESCE(s.progress_seq, 0)
               FROM jobs j LEFT JOIN jobs_progress s ON s.job_id = j.id WHERE j.id = $1"
        }
    };
    sqlx::query_as(sql)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Claims the next job (a grouped mark may take a moment to land).
async fn claim(store: &DbStore<Job>) -> DbJob<Job> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut jobs = store.dequeue("host", &Default::default(), 1).await.unwrap();
        if let Some(mut job) = jobs.pop() {
            assert!(store.open(&mut job).await.unwrap());
            return job;
        }
        assert!(Instant::now() < deadline, "no job to claim");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_checkpoint_survives_retries_and_resets_and_completion_drops_it(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut first = claim(&store).await;
    assert_eq!(first.checkpoint::<Value>(&store).await.unwrap(), None);
    first
        .save_checkpoint(&store, json!({"next": 1}))
        .await
        .unwrap();
    first
        .save_checkpoint(&store, json!({"next": 2}))
        .await
        .unwrap();
    first
        .set_progress(&store, json!({"percent": 20}))
        .await
        .unwrap();
    store.mark_errored(&mut first, "retry", None).await.unwrap();
    db.execute("UPDATE jobs SET process_after = now()").await;

    let mut second = claim(&store).await;
    assert_eq!(
        second.checkpoint::<Value>(&store).await.unwrap(),
        Some(json!({"next": 2}))
    );
    second
        .save_checkpoint(&store, json!({"next": 3}))
        .await
        .unwrap();
    // Reset (as the resetter does for a dead worker): the attempt is stale.
    db.execute("UPDATE jobs SET state = 'queued'").await;
    let mut third = claim(&store).await;
    let refused = second.save_checkpoint(&store, json!({"next": 99})).await;
    assert!(
        matches!(refused, Err(Error::ProgressRefused { .. })),
        "{refused:?}"
    );
    let refused = second.set_progress(&store, json!({"percent": 0})).await;
    assert!(
        matches!(refused, Err(Error::ProgressRefused { .. })),
        "{refused:?}"
    );
    assert_eq!(
        third.checkpoint::<Value>(&store).await.unwrap(),
        Some(json!({"next": 3}))
    );
    third
        .set_progress(&store, json!({"percent": 100}))
        .await
        .unwrap();
    store.mark_complete(&mut third).await.unwrap();
    let (progress, checkpoint, seq) = stored(&db, storage, id).await;
    assert_eq!(progress, Some(json!({"percent": 100})));
    assert_eq!(checkpoint, None, "completion drops the checkpoint");
    assert_eq!(
        seq, 5,
        "the third attempt's write numbered above the second's, the stale ones refused"
    );
}

async fn a_transactional_checkpoint_commits_with_the_handlers_writes(storage: Storage) {
    let (db, store) = progress_store(Handling::Transactional, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim(&store).await;
    let write = |note: &'static str| {
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, $2)")
            .bind(id)
            .bind(note)
    };
    write("before").execute(job.tx().unwrap()).await.unwrap();
    job.save_checkpoint(&store, json!({"done": "before"}))
        .await
        .unwrap();
    // Committed together: visible outside the job's transaction now.
    let notes: Vec<String> = sqlx::query_scalar("SELECT note FROM side_effects")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(notes, ["before"]);
    write("after").execute(job.tx().unwrap()).await.unwrap();
    store.mark_errored(&mut job, "crash", None).await.unwrap();
    let notes: Vec<String> = sqlx::query_scalar("SELECT note FROM side_effects")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        notes,
        ["before"],
        "what came after the checkpoint rolled back"
    );
    db.execute("UPDATE jobs SET process_after = now()").await;
    let mut again = claim(&store).await;
    assert_eq!(
        again.checkpoint::<Value>(&store).await.unwrap(),
        Some(json!({"done": "before"}))
    );
}

async fn oversized_or_nul_progress_is_refused_and_a_table_without_it_is_named(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    db.enqueue(1, json!({})).await;
    let mut job = claim(&store).await;
    let big = "x".repeat(70_000);
    let refused = job.save_checkpoint(&store, json!({"big": big})).await;
    assert!(
        matches!(refused, Err(Error::ProgressTooLarge { cap: 65_536, .. })),
        "{refused:?}"
    );
    let refused = job.set_progress(&store, json!({"s": "a\u{0}b"})).await;
    assert!(
        matches!(refused, Err(Error::NulCharacter { .. })),
        "{refused:?}"
    );
    let plain = Db::new().await;
    plain.enqueue(1, json!({})).await;
    let store = plain.store(Handling::Heartbeat).await;
    let mut job = claim(&store).await;
    let err = job
        .set_progress(&store, json!(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("--progress"), "{err}");
    // Asked for on a table that keeps it nowhere: both ways to add it named.
    let mut o = Db::table_options();
    o.progress = true;
    let err = JobTable::new(&plain.pool, o).await.unwrap_err().to_string();
    assert!(
        err.contains("--progress` adds")
            && err.contains("`--progress-table` creates the side table jobs_progress"),
        "{err}"
    );
}

/// Reports its progress every 10 ms for a second, then sets the last word.
struct Reports;
impl Handler<DbStore<Job>> for Reports {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        for n in 0..100 {
            job.report_progress(ctx.store(), json!({ "n": n }))?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        job.set_progress(ctx.store(), json!({ "n": "done" }))
            .await?;
        Ok(())
    }
}

async fn reported_progress_rides_on_the_heartbeat(storage: Storage) {
    let (db, table) = progress_table(storage).await;
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(60);
    let store = Arc::new(DbStore::<Job>::new(&db.pool, &table, so).await.unwrap());
    db.enqueue(10, json!({})).await;
    let mut wo = WorkerOptions::new("reports");
    wo.num_handlers = 10;
    wo.heartbeat_interval = Duration::from_millis(200);
    wo.num_total_jobs = Some(10);
    let worker = new_worker(store, Arc::new(Reports), wo).unwrap();
    let run = tokio::spawn(worker.run());
    // Halfway, other connections see progress that never had a statement.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let mut midway = 0;
    for id in &ids {
        midway += i64::from(stored(&db, storage, *id).await.0.is_some());
    }
    assert_eq!(midway, 10, "every running job's progress is visible midway");
    run.await.unwrap();
    for id in ids {
        let (progress, _, seq) = stored(&db, storage, id).await;
        assert_eq!(progress, Some(json!({"n": "done"})));
        // A second of heartbeats every 200 ms, and the last word: not 101.
        assert!((2..=9).contains(&seq), "{seq} progress writes");
    }
}

/// A write lands only above the newest write's number: one a larger number
/// outran (here a write from elsewhere) is refused, and changes nothing.
async fn a_write_that_lost_to_another_is_refused(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim(&store).await;
    job.save_checkpoint(&store, json!({"next": 1}))
        .await
        .unwrap();
    assert_eq!(
        job.checkpoint::<Value>(&store).await.unwrap(),
        Some(json!({"next": 1}))
    );
    db.execute(match storage {
        Storage::Columns => "UPDATE jobs SET progress_seq = progress_seq + 100",
        Storage::Side => "UPDATE jobs_progress SET progress_seq = progress_seq + 100",
    })
    .await;
    let refused = job.save_checkpoint(&store, json!({"next": 0})).await;
    assert!(
        matches!(refused, Err(Error::ProgressRefused { .. })),
        "{refused:?}"
    );
    assert_eq!(stored(&db, storage, id).await.1, Some(json!({"next": 1})));
}

/// A report a heartbeat wrote takes a number of the attempt's: its next
/// write is numbered above it, and accepted (under the old write count it
/// was refused as a write another had overtaken, and the job stopped). On the columns, in transactional
/// handling, a report made while the job's own transaction holds the row
/// (after `set_progress`) is skipped by the beat and written by the
/// attempt's end, not dropped as written.
async fn a_report_a_beat_wrote_leaves_the_attempts_next_write_accepted(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim(&store).await;
    assert_eq!(job.checkpoint::<Value>(&store).await.unwrap(), None);
    job.save_checkpoint(&store, json!({"next": 1}))
        .await
        .unwrap();
    job.report_progress(&store, json!({"n": 1})).unwrap();
    store.heartbeat(&[job.lease()]).await.unwrap();
    assert_eq!(stored(&db, storage, id).await.0, Some(json!({"n": 1})));
    job.save_checkpoint(&store, json!({"next": 2}))
        .await
        .expect("a write after a beat carried a report is this attempt's own");
    assert_eq!(
        stored(&db, storage, id).await,
        (Some(json!({"n": 1})), Some(json!({"next": 2})), 3)
    );
    assert!(store.mark_complete(&mut job).await.unwrap());
    if storage == Storage::Side {
        return;
    }
    let (db, store) = progress_store(Handling::Transactional, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim(&store).await;
    job.set_progress(&store, json!({"n": 0})).await.unwrap();
    job.report_progress(&store, json!({"n": "last"})).unwrap();
    store.heartbeat(&[job.lease()]).await.unwrap();
    store.heartbeat(&[job.lease()]).await.unwrap();
    assert!(store.mark_complete(&mut job).await.unwrap());
    assert_eq!(
        stored(&db, storage, id).await.0,
        Some(json!({"n": "last"})),
        "the report the beats skipped is the last word"
    );
}

/// A beat carrying a report is given up at its timeout before it locked the
/// row (a statement trigger holds it on an advisory lock the test holds:
/// its snapshot is taken, its lock step not yet run), the attempt writes a
/// newer value, and the beat commits after it. Each write is numbered when
/// sent: the late beat's number is below the newer write's, so the row keeps
/// the newer value, through the next beat and the attempt's completion.
async fn a_beat_given_up_that_commits_after_a_newer_write_changes_nothing(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut job = claim(&store).await;
    job.report_progress(&store, json!({"n": "older"})).unwrap();
    db.execute(
        "CREATE FUNCTION hold_beat() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF current_query() LIKE '%dbworker_touched%progress%' THEN
           PERFORM pg_advisory_xact_lock_shared(4242); END IF; RETURN NULL; END $$;
         CREATE TRIGGER hold_beat BEFORE UPDATE ON jobs
           FOR EACH STATEMENT EXECUTE FUNCTION hold_beat();",
    )
    .await;
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let given_up =
        tokio::time::timeout(Duration::from_millis(300), store.heartbeat(&[job.lease()])).await;
    assert!(given_up.is_err(), "the beat is held");
    job.set_progress(&store, json!({"n": "newer"}))
        .await
        .expect("the newer write lands while the beat is held");
    let beaten = || async {
        sqlx::query_scalar::<_, f64>(
            "SELECT EXTRACT(EPOCH FROM last_heartbeat_at)::float8 FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let before = beaten().await;
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while beaten().await == before {
        assert!(
            Instant::now() < deadline,
            "the given-up beat never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        stored(&db, storage, id).await.0,
        Some(json!({"n": "newer"})),
        "the late beat put the older report over the newer value"
    );
    // The report it carried went back when it was given up; the newer write
    // superseded it: no beat sends it again.
    store.heartbeat(&[job.lease()]).await.unwrap();
    assert!(store.mark_complete(&mut job).await.unwrap());
    assert_eq!(
        stored(&db, storage, id).await.0,
        Some(json!({"n": "newer"})),
        "the last value written is the job's progress after its completion"
    );
}

/// A value reported and not yet carried by a heartbeat (none runs here) is
/// written by the attempt's end, whichever way it ends, in both handling
/// modes: the last word reported is never dropped.
async fn the_last_reported_progress_survives_completion_error_and_snooze(storage: Storage) {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        let (db, store) = progress_store(handling, storage).await;
        for outcome in ["complete", "error", "snooze"] {
            let id = db.enqueue(1, json!({})).await[0];
            let mut job = claim(&store).await;
            job.set_progress(&store, json!({"n": 0})).await.unwrap();
            job.report_progress(&store, json!({"n": 1})).unwrap();
            job.report_progress(&store, json!({"last": outcome}))
                .unwrap();
            let marked = match outcome {
                "complete" => store.mark_complete(&mut job).await.unwrap(),
                "error" => store
                    .mark_errored(&mut job, "retry", None)
                    .await
                    .unwrap()
                    .is_some(),
                _ => store
                    .mark_snoozed(&mut job, Duration::from_secs(3600))
                    .await
                    .unwrap(),
            };
            assert!(marked, "{handling:?} {outcome}");
            let deadline = Instant::now() + Duration::from_secs(5);
            while db.state(id).await == "processing" {
                assert!(
                    Instant::now() < deadline,
                    "{handling:?} {outcome}: never marked"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (progress, checkpoint, seq) = stored(&db, storage, id).await;
            assert_eq!(
                progress,
                Some(json!({"last": outcome})),
                "{handling:?} {outcome}"
            );
            assert_eq!(checkpoint, None);
            // The last report is the attempt's second write, numbered 2,
            // whether the set progress landed or (in transactional handling,
            // committed with the job's transaction: a failed or snoozed
            // attempt's rolls back) not.
            assert_eq!(seq, 2, "{handling:?} {outcome}: set, then the last report");
            // Out of the next claim's way (an errored job retries at once here).
            db.execute(&format!(
                "UPDATE jobs SET process_after = now() + interval '1 day' WHERE id = {id}"
            ))
            .await;
        }
    }
}

/// On a table without the columns, the side table is what `dbworker show`,
/// the job page and `top` read, and what the purger cleans: a purged job's
/// row goes with it, so the side table never only grows.
#[tokio::test]
async fn the_side_table_is_shown_listed_and_purged_with_its_jobs() {
    let (db, table) = progress_table(Storage::Side).await;
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
    let ids = db.enqueue(2, json!({})).await;
    let mut running = claim(&store).await;
    let rid = running.record().id;
    running
        .set_progress(&store, json!({"percent": 40}))
        .await
        .unwrap();
    let admin = dbworker::admin::Admin::new(&db.pool, &table).await.unwrap();
    assert!(admin.has_progress());
    // Detected, as the columns are.
    let detected = JobTable::new(&db.pool, dbworker::JobTableOptions::detected("jobs"))
        .await
        .unwrap();
    assert!(detected.has_progress());
    let listed = admin.running(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].progress, Some(json!({"percent": 40})));
    let row = admin.show(rid).await.unwrap().unwrap();
    assert_eq!(row["progress"], json!({"percent": 40}));
    // The keys the columns would show, whichever holds them.
    assert_eq!(row["checkpoint"], Value::Null);
    assert!(
        row["progress_seq"].as_i64().is_some_and(|n| n >= 1),
        "{row}"
    );
    // A job without a side row shows none.
    let other = ids.iter().copied().find(|i| *i != rid).unwrap();
    assert_eq!(
        admin.show(other).await.unwrap().unwrap()["progress"],
        Value::Null
    );
    assert!(store.mark_complete(&mut running).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.state(rid).await != "completed" {
        assert!(Instant::now() < deadline, "never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.execute(
        "UPDATE jobs SET finished_at = now() - interval '30 days' WHERE state = 'completed'",
    )
    .await;
    let purger = dbworker::maintenance::Purger::new(
        &db.pool,
        &table,
        dbworker::maintenance::PurgeOptions::new(),
    )
    .await
    .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().total(), 1);
    let side_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_progress")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(side_rows, 0, "the purged job's side row went with it");
}

/// Jobs deleted by plain SQL (or in a dropped partition) leave their
/// progress side rows and mailbox rows behind: each purger pass deletes
/// those in a window of ten chunks per table (a new purger starts at a
/// random key), moving on and wrapping, and keeps the rows of jobs that
/// exist.
#[tokio::test]
async fn side_rows_of_jobs_deleted_other_ways_are_swept_by_the_purger() {
    let (db, table) = side_and_mailbox().await;
    let ids = db.enqueue(40, json!({})).await;
    side_rows(&db, &ids).await;
    // The 25 newest jobs deleted behind the purger's back; 15 stay.
    let (kept, gone) = ids.split_at(15);
    delete_jobs(&db, gone).await;
    let mut o = dbworker::maintenance::PurgeOptions::new();
    o.chunk_size = 1; // a window of 10 rows per table and pass
    let purger = dbworker::maintenance::Purger::new(&db.pool, &table, o)
        .await
        .unwrap();
    let sweep_until = |target: u64| {
        let purger = purger.clone();
        async move {
            let (mut swept, mut passes) = (0, 0);
            while swept < target {
                let orphans = purger.purge_once().await.unwrap().orphans;
                assert!(orphans <= 20, "at most a window per table: {orphans}");
                swept += orphans;
                passes += 1;
                assert!(
                    passes <= 8,
                    "the window moves on and wraps: {swept} after {passes}"
                );
            }
            assert_eq!(swept, target);
        }
    };
    sweep_until(50).await;
    assert_eq!(side_counts(&db).await, (15, 15));
    // Then the oldest five, which the window passed long ago: found after a
    // wrap.
    let (older, kept) = kept.split_at(5);
    delete_jobs(&db, older).await;
    sweep_until(10).await;
    assert_eq!(side_counts(&db).await, (10, 10));
    let left: Vec<i64> = sqlx::query_scalar(
        "SELECT job_id FROM jobs_progress INTERSECT SELECT job_id FROM jobs_signals ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, kept, "the existing jobs' rows stay");
    for _ in 0..4 {
        assert_eq!(purger.purge_once().await.unwrap().orphans, 0);
    }
}

/// A purger whose role row-level security may hide jobs from would take a
/// hidden job for a deleted one: it leaves side rows alone.
#[tokio::test]
async fn a_purger_that_row_security_hides_jobs_from_sweeps_nothing() {
    let (db, table) = side_and_mailbox().await;
    let ids = db.enqueue(4, json!({})).await;
    side_rows(&db, &ids).await;
    let role = format!("rls_{}", db.db.name());
    let role = role[..role.len().min(63)].to_owned();
    db.execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN;
         GRANT CONNECT ON DATABASE \"{db_name}\" TO \"{role}\";
         GRANT USAGE ON SCHEMA public TO \"{role}\";
         GRANT SELECT, UPDATE, DELETE ON jobs TO \"{role}\";
         GRANT SELECT, DELETE ON jobs_progress, jobs_signals TO \"{role}\";
         ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
         CREATE POLICY even_only ON jobs TO \"{role}\" USING (id % 2 = 0);",
        db_name = db.db.name()
    ))
    .await;
    let options: sqlx::postgres::PgConnectOptions = db.db.url().parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.username(&role))
        .await
        .unwrap();
    let purger = dbworker::maintenance::Purger::new(
        &pool,
        &table,
        dbworker::maintenance::PurgeOptions::new(),
    )
    .await
    .unwrap();
    assert_eq!(purger.purge_once().await.unwrap().orphans, 0);
    assert_eq!(side_counts(&db).await, (4, 4), "no hidden job's rows went");
    pool.close().await;
    db.execute(&format!(
        "DROP POLICY even_only ON jobs; ALTER TABLE jobs DISABLE ROW LEVEL SECURITY;
         REVOKE ALL ON jobs, jobs_progress, jobs_signals FROM \"{role}\";
         REVOKE ALL ON SCHEMA public FROM \"{role}\";
         REVOKE ALL ON DATABASE \"{db_name}\" FROM \"{role}\";
         DROP ROLE \"{role}\";",
        db_name = db.db.name()
    ))
    .await;
}

/// The test table with the progress side table and the signal mailbox.
async fn side_and_mailbox() -> (Db, JobTable) {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
        .await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &HashMap::new()).unwrap())
        .await;
    let table = db
        .table_with(|o| {
            o.progress = true;
            o.signals = true;
        })
        .await;
    (db, table)
}

/// A progress side row and a signal for each of `ids`.
async fn side_rows(db: &Db, ids: &[i64]) {
    for id in ids {
        sqlx::query("INSERT INTO jobs_progress (job_id, progress) VALUES ($1, '{}')")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
        sqlx::query("SELECT jobs_signal($1, 'go')")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
    }
}

async fn delete_jobs(db: &Db, ids: &[i64]) {
    sqlx::query("DELETE FROM jobs WHERE id = ANY($1)")
        .bind(ids)
        .execute(&db.pool)
        .await
        .unwrap();
}

/// Rows in the progress side table and in the mailbox.
async fn side_counts(db: &Db) -> (i64, i64) {
    let count = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql).fetch_one(&db.pool);
    (
        count("SELECT count(*) FROM jobs_progress").await.unwrap(),
        count("SELECT count(*) FROM jobs_signals").await.unwrap(),
    )
}

/// Saves a checkpoint, then completes (even ids) or fails (odd ids).
struct CheckpointsThenHalfFail;
impl Handler<DbStore<Job>> for CheckpointsThenHalfFail {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        job.save_checkpoint(ctx.store(), json!({"at": 1}))
            .await
            .map_err(HandlerError::retryable)?;
        if job.record().id % 2 == 1 {
            return Err(HandlerError::non_retryable(std::io::Error::other("odd")));
        }
        Ok(())
    }
}

/// Completions grouped with failures in one statement (heartbeat handling,
/// many jobs ending at once) drop their checkpoints as alone, wherever they
/// are kept; the failed jobs keep theirs.
async fn a_completion_grouped_with_failures_drops_its_checkpoint(storage: Storage) {
    let (db, table) = progress_table(storage).await;
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(60);
    let store = Arc::new(DbStore::<Job>::new(&db.pool, &table, so).await.unwrap());
    db.enqueue(400, json!({})).await;
    let mut wo = WorkerOptions::new("mixed");
    wo.num_handlers = 64;
    wo.num_total_jobs = Some(400);
    new_worker(store, Arc::new(CheckpointsThenHalfFail), wo)
        .unwrap()
        .run()
        .await;
    let sql = match storage {
        Storage::Columns => {
            "SELECT state, count(*) FILTER (WHERE checkpoint IS NOT NULL) FROM jobs GROUP BY state ORDER BY state"
        }
        Storage::Side => {
            "SELECT j.state, count(*) FILTER (WHERE s.checkpoint IS NOT NULL)
               FROM jobs j LEFT JOIN jobs_progress s ON s.job_id = j.id GROUP BY j.state ORDER BY j.state"
        }
    };
    let by_state: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(&db.pool).await.unwrap();
    assert_eq!(
        by_state,
        [("completed".to_owned(), 0), ("failed".to_owned(), 200)]
    );
}

/// An operator's completion (`Admin`, so the CLI and the dashboard, and the
/// SQL function `complete_jobs`) leaves the job as a worker's completion
/// does: the checkpoint dropped, the progress kept. A job requeued after it
/// starts over, not at the old work's checkpoint.
async fn an_operators_completion_drops_the_checkpoint_as_a_workers_does(storage: Storage) {
    let (db, store) = progress_store(Handling::Heartbeat, storage).await;
    let table = db.table_with(|o| o.progress = true).await;
    let admin = dbworker::admin::Admin::new(&db.pool, &table).await.unwrap();
    let mut columns = dbworker::ddl::OptionalColumns::default();
    columns.progress = storage == Storage::Columns;
    db.execute(&dbworker::ddl::admin_functions_sql("jobs", &HashMap::new(), columns).unwrap())
        .await;
    let ids = db.enqueue(2, json!({})).await;
    // Both claimed before either fails (a failed job may come due at once).
    let jobs = store.dequeue("host", &Default::default(), 2).await.unwrap();
    assert_eq!(jobs.len(), 2);
    for mut job in jobs {
        assert!(store.open(&mut job).await.unwrap());
        let id = job.record().id;
        job.save_checkpoint(&store, json!({"next": id}))
            .await
            .unwrap();
        job.set_progress(&store, json!({"percent": 40}))
            .await
            .unwrap();
        store.mark_errored(&mut job, "retry", None).await.unwrap();
    }
    let done = admin
        .act_on_ids(&ids[..1], &dbworker::admin::BulkAction::Complete)
        .await
        .unwrap();
    assert_eq!(done, 1);
    let outcome: String = db
        .scalar(
            "SELECT outcome FROM jobs_complete_jobs(ARRAY[$1::bigint])",
            ids[1],
        )
        .await;
    assert_eq!(outcome, "done");
    for id in ids {
        let (progress, checkpoint, _) = stored(&db, storage, id).await;
        assert_eq!(
            (progress, checkpoint),
            (Some(json!({"percent": 40})), None),
            "job {id}: the completion kept the old work's checkpoint"
        );
    }
}
