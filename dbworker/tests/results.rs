//! Results passed downstream on Postgres: a handler's result is stored with
//! its completion (both handling modes, single and grouped marks), a
//! dependent reads the results of the jobs it waited for by task name, the
//! size cap fails the job with a clear message, and a stale completion
//! writes nothing. And what a handler keeps while it runs: progress and
//! checkpoints, fenced, surviving retries and resets.

mod common;

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
use workerutil::{Handler, HandlerError, JobContext, Store, WorkerOptions};

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

/// The test table with progress columns, and a store over it.
async fn progress_store(handling: Handling) -> (Db, DbStore<Job>) {
    let db = Db::new().await;
    db.add_columns(|c| c.progress = true, &[]).await;
    let table = db.table_with(|o| o.progress = true).await;
    assert!(table.has_progress());
    let mut o = db.options();
    o.handling = handling;
    o.max_num_retries = 5;
    let store = DbStore::new(&db.pool, &table, o).await.unwrap();
    (db, store)
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

#[tokio::test]
async fn a_checkpoint_survives_retries_and_resets_and_completion_drops_it() {
    let (db, store) = progress_store(Handling::Heartbeat).await;
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
    let (progress, checkpoint, seq): (Option<Value>, Option<Value>, i64) =
        sqlx::query_as("SELECT progress, checkpoint, progress_seq FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(progress, Some(json!({"percent": 100})));
    assert_eq!(checkpoint, None, "completion drops the checkpoint");
    assert_eq!(seq, 5, "every write counted, none of the stale ones");
}

#[tokio::test]
async fn a_transactional_checkpoint_commits_with_the_handlers_writes() {
    let (db, store) = progress_store(Handling::Transactional).await;
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

#[tokio::test]
async fn oversized_or_nul_progress_is_refused_and_a_table_without_it_is_named() {
    let (db, store) = progress_store(Handling::Heartbeat).await;
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

#[tokio::test]
async fn reported_progress_rides_on_the_heartbeat() {
    let db = Db::new().await;
    db.add_columns(|c| c.progress = true, &[]).await;
    let table = db.table_with(|o| o.progress = true).await;
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
    let midway: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE progress IS NOT NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(midway, 10, "every running job's progress is visible midway");
    run.await.unwrap();
    let rows: Vec<(Value, i64)> = sqlx::query_as("SELECT progress, progress_seq FROM jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    for (progress, seq) in rows {
        assert_eq!(progress, json!({"n": "done"}));
        // A second of heartbeats every 200 ms, and the last word: not 101.
        assert!((2..=9).contains(&seq), "{seq} progress writes");
    }
}
