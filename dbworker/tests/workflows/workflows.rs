//! Workflows on real Postgres: a job never starts before everything it waits
//! for has completed (checked from the database's own `started_at` and
//! `finished_at`), each runs exactly once, dependents are released exactly
//! once however many completions race for them, failure policies cancel or
//! let run, and a cyclic workflow inserts nothing.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{
    DbJob, DbStore, DependencyPolicy, Handling, JobTable, NewJob, Resetter, ResetterOptions,
    StoreOptions,
    admin::Admin,
    ddl::workflows_sql,
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use workerutil::{Handler, HandlerError, JobContext, ShutdownHandle, WorkerOptions};

use common::{Db, Job};

/// Records each run in `side_effects` (in the job's transaction when it has
/// one); fails, for good, the jobs whose payload says `"fail": true`.
struct Recorder(sqlx::PgPool);
impl Handler<DbStore<Job>> for Recorder {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let fail = job.record().payload["fail"] == serde_json::json!(true);
        let insert =
            sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')").bind(id);
        match job.tx() {
            Some(tx) => insert.execute(tx).await?,
            None => insert.execute(&self.0).await?,
        };
        if fail {
            return Err(HandlerError::non_retryable("told to fail"));
        }
        Ok(())
    }
}

pub(crate) async fn set_up() -> (Db, Workflows) {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.execute(
        "ALTER TABLE side_effects ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp()",
    )
    .await;
    let workflows = Workflows::new(&db.pool, &table(&db).await).await.unwrap();
    (db, workflows)
}

/// The test table with workflows, as every service here takes it.
pub(crate) async fn table(db: &Db) -> JobTable {
    db.table_with(|t| t.workflows = true).await
}

/// A store on a pool of its own (another process, as Postgres sees it).
async fn store(db: &Db, handling: Handling, handlers: u32) -> Arc<DbStore<Job>> {
    let mut o: StoreOptions = Db::options_for_tests();
    o.handling = handling;
    o.stall.stalled_max_age = Duration::from_secs(30);
    let pool = db.db.pool(handlers + 4).await.unwrap();
    Arc::new(DbStore::new(&pool, &table(db).await, o).await.unwrap())
}

/// Runs `workers` workers of `handlers` handlers each (alternating handling
/// modes when `mixed`) until no job is pending, queued, errored or processing.
async fn run_until_done(db: &Db, workers: usize, handlers: usize, handling: Option<Handling>) {
    let mut shutdowns: Vec<ShutdownHandle> = Vec::new();
    let mut runs = Vec::new();
    for n in 0..workers {
        let h = handling.unwrap_or(if n % 2 == 0 {
            Handling::Heartbeat
        } else {
            Handling::Transactional
        });
        let s = store(db, h, u32::try_from(handlers).unwrap()).await;
        let mut o = WorkerOptions::new(format!("process-{n}"));
        o.num_handlers = handlers;
        o.interval = Duration::from_millis(10);
        let worker = new_worker(s, Recorder(db.pool.clone()), o).unwrap();
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

/// When job `id`'s handler ran (its write's stamp, `clock_timestamp()` inside
/// the handler) and when it finished (`finished_at`, stamped by its mark before
/// the commit that releases its dependents), in microseconds by the database
/// clock. Not `started_at`: that is the claim's transaction start (`now()`),
/// taken before the claim's snapshot, so under load it may precede an
/// upstream's finish whose release the same claim then sees committed.
async fn times(db: &Db, id: i64) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (EXTRACT(EPOCH FROM (SELECT min(s.at) FROM side_effects s WHERE s.job_id = j.id)) * 1e6)::bigint,
                (EXTRACT(EPOCH FROM finished_at) * 1e6)::bigint FROM jobs j WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn runs(db: &Db, id: i64) -> i64 {
    db.scalar("SELECT count(*) FROM side_effects WHERE job_id = $1", id)
        .await
}

fn diamond() -> Workflow {
    Workflow::new()
        .task(Task::new("a", NewJob::new()))
        .task(Task::new("b", NewJob::new()).after(["a"]))
        .task(Task::new("c", NewJob::new()).after(["a"]))
        .task(Task::new("d", NewJob::new()).after(["b", "c"]))
}

async fn diamond_runs_in_order(handling: Handling) {
    let (db, workflows) = set_up().await;
    let wf = workflows.enqueue(&diamond()).await.unwrap();
    let id = |n: &str| wf.id_of(n).unwrap();
    assert_eq!(db.state(id("a")).await, "queued");
    for n in ["b", "c", "d"] {
        assert_eq!(db.state(id(n)).await, "pending", "{n} waits");
    }
    run_until_done(&db, 2, 4, Some(handling)).await;
    for n in ["a", "b", "c", "d"] {
        assert_eq!(db.state(id(n)).await, "completed", "{n}");
        assert_eq!(runs(&db, id(n)).await, 1, "{n} ran once");
    }
    let (a, b, c, d) = (
        times(&db, id("a")).await,
        times(&db, id("b")).await,
        times(&db, id("c")).await,
        times(&db, id("d")).await,
    );
    assert!(b.0 >= a.1 && c.0 >= a.1, "b and c start after a finished");
    assert!(d.0 >= b.1 && d.0 >= c.1, "d starts after b and c finished");
    let status = workflows.status(wf.id).await.unwrap().unwrap();
    assert_eq!(status.counts.get("completed"), Some(&4));
    assert!(status.is_finished());
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "every edge was released");
}

#[tokio::test]
async fn a_diamond_runs_in_order_in_heartbeat_handling() {
    diamond_runs_in_order(Handling::Heartbeat).await;
}

#[tokio::test]
async fn a_diamond_runs_in_order_in_transactional_handling() {
    diamond_runs_in_order(Handling::Transactional).await;
}

/// Task `i` of a workflow waits for these earlier tasks: a tree of depth
/// five, and the last task waits for the ten before it.
fn upstream_of(i: usize) -> Vec<usize> {
    match i {
        0 => vec![],
        19 => (9..19).collect(),
        _ if i >= 3 => vec![(i - 1) / 2, i / 3],
        _ => vec![(i - 1) / 2],
    }
}

#[tokio::test]
async fn four_workers_of_sixteen_handlers_never_start_a_task_early() {
    let (db, workflows) = set_up().await;
    let mut edges = Vec::new();
    let mut all = Vec::new();
    for _ in 0..200 {
        let mut wf = Workflow::new();
        for i in 0..20 {
            let mut after: Vec<String> = upstream_of(i).iter().map(|u| format!("t{u}")).collect();
            after.dedup();
            wf = wf.task(Task::new(format!("t{i}"), NewJob::new()).after(after));
        }
        let enqueued = workflows.enqueue(&wf).await.unwrap();
        for i in 0..20 {
            let d = enqueued.id_of(&format!("t{i}")).unwrap();
            all.push(d);
            for u in upstream_of(i) {
                edges.push((d, enqueued.id_of(&format!("t{u}")).unwrap()));
            }
        }
    }
    run_until_done(&db, 4, 16, None).await;
    assert_eq!(db.count("completed").await, 4000);
    let counts: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT job_id, count(*) FROM side_effects GROUP BY job_id HAVING count(*) <> 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(counts.is_empty(), "jobs not run exactly once: {counts:?}");
    let ran: i64 = sqlx::query_scalar("SELECT count(DISTINCT job_id) FROM side_effects")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ran, 4000);
    // Each handler ran after every upstream finished (see `times`).
    let early: Vec<(i64, i64, f64)> = sqlx::query_as(
        "SELECT d.id, u.id, EXTRACT(EPOCH FROM u.finished_at - d.started_at)::float8
           FROM unnest($1::bigint[], $2::bigint[]) AS e(d, u)
           JOIN jobs d ON d.id = e.d JOIN jobs u ON u.id = e.u
           JOIN side_effects s ON s.job_id = d.id
          WHERE s.at < u.finished_at",
    )
    .bind(edges.iter().map(|e| e.0).collect::<Vec<_>>())
    .bind(edges.iter().map(|e| e.1).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        early.is_empty(),
        "ran before an upstream finished (dependent, upstream, started_at gap): {early:?}"
    );
}

#[tokio::test]
async fn a_failed_upstream_cancels_its_dependents_unless_they_ignore_it() {
    let (db, workflows) = set_up().await;
    let fail = NewJob::new().json("payload", serde_json::json!({"fail": true}));
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("a", fail))
                .task(Task::new("b", NewJob::new()).after(["a"]))
                .task(Task::new("c", NewJob::new()).after(["b"]))
                .task(
                    Task::new("d", NewJob::new()).after_with(["a"], DependencyPolicy::IgnoreFailed),
                )
                .task(
                    Task::new("e", NewJob::new())
                        .after_with(["a"], DependencyPolicy::IgnoreCanceled),
                ),
        )
        .await
        .unwrap();
    let id = |n: &str| wf.id_of(n).unwrap();
    run_until_done(&db, 1, 4, Some(Handling::Heartbeat)).await;
    assert_eq!(db.state(id("a")).await, "failed");
    assert_eq!(db.state(id("b")).await, "canceled", "cancel: the default");
    assert_eq!(db.state(id("c")).await, "canceled", "down the graph");
    assert_eq!(db.state(id("d")).await, "completed", "ignore_failed runs");
    assert_eq!(
        db.state(id("e")).await,
        "canceled",
        "ignore_canceled does not ignore a failure"
    );
    for n in ["b", "c", "e"] {
        assert_eq!(runs(&db, id(n)).await, 0, "{n} never ran");
    }
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", id("b"))
        .await;
    assert!(message.contains("was failed"), "{message}");

    // A retry of the failed job brings what it canceled back.
    sqlx::query("UPDATE jobs SET payload = '{}' WHERE id = $1")
        .bind(id("a"))
        .execute(&db.pool)
        .await
        .unwrap();
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    assert!(admin.requeue(id("a")).await.unwrap());
    for n in ["b", "c", "e"] {
        assert_eq!(db.state(id(n)).await, "pending", "{n} waits again");
    }
    run_until_done(&db, 1, 4, Some(Handling::Transactional)).await;
    for n in ["a", "b", "c", "e"] {
        assert_eq!(db.state(id(n)).await, "completed", "{n}");
    }
    assert_eq!(runs(&db, id("d")).await, 1, "d ran once, not again");
}

#[tokio::test]
async fn a_canceled_workflow_cancels_every_waiting_task() {
    let (db, workflows) = set_up().await;
    let wf = workflows.enqueue(&diamond()).await.unwrap();
    let outside = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after([wf.id_of("d").unwrap()]))
        .await
        .unwrap()
        .id();
    let canceled = workflows.cancel(wf.id).await.unwrap();
    assert_eq!(canceled.canceled, 4);
    assert_eq!(
        db.count("canceled").await,
        5,
        "the job outside follows its policy"
    );
    assert_eq!(db.state(outside).await, "canceled");
    let status = workflows.status(wf.id).await.unwrap().unwrap();
    assert_eq!(status.counts.get("canceled"), Some(&4));
    let d = status.tasks.iter().find(|t| t.name == "d").unwrap();
    assert_eq!(d.waits_on, vec!["b".to_owned(), "c".to_owned()]);
}

#[tokio::test]
async fn cycles_and_unknown_names_are_refused_before_any_insert() {
    let (db, workflows) = set_up().await;
    let cycle = Workflow::new()
        .task(Task::new("a", NewJob::new()))
        .task(Task::new("b", NewJob::new()).after(["a", "d"]))
        .task(Task::new("c", NewJob::new()).after(["b"]))
        .task(Task::new("d", NewJob::new()).after(["c"]));
    let err = workflows.enqueue(&cycle).await.unwrap_err().to_string();
    assert!(err.contains("cycle"), "{err}");
    let unknown = Workflow::new().task(Task::new("a", NewJob::new()).after(["nope"]));
    let err = workflows.enqueue(&unknown).await.unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    let rows: i64 =
        sqlx::query_scalar("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM jobs_deps)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn after_existing_jobs_counts_finished_ones_at_once() {
    let (db, workflows) = set_up().await;
    let enqueuer = workflows.enqueuer();
    let done = db.enqueue(1, serde_json::json!({})).await[0];
    let failed = db.enqueue(1, serde_json::json!({})).await[0];
    let waiting = db.enqueue(1, serde_json::json!({})).await[0];
    sqlx::query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1")
        .bind(done)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
        .bind(failed)
        .execute(&db.pool)
        .await
        .unwrap();
    let after_done = enqueuer
        .enqueue(&NewJob::new().after([done]))
        .await
        .unwrap()
        .id();
    assert_eq!(
        db.state(after_done).await,
        "queued",
        "a completed upstream counts at once"
    );
    let after_failed = enqueuer
        .enqueue(&NewJob::new().after([failed, waiting]))
        .await
        .unwrap()
        .id();
    assert_eq!(
        db.state(after_failed).await,
        "canceled",
        "a failed upstream cancels at once"
    );
    let ignoring = enqueuer
        .enqueue(
            &NewJob::new()
                .after_with([failed], DependencyPolicy::IgnoreFailed)
                .after([waiting]),
        )
        .await
        .unwrap()
        .id();
    assert_eq!(db.state(ignoring).await, "pending");
    let err = enqueuer
        .enqueue(&NewJob::new().after([999_999]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("999999"), "{err}");
    run_until_done(&db, 1, 4, Some(Handling::Transactional)).await;
    assert_eq!(db.state(ignoring).await, "completed");
    assert_eq!(db.state(after_failed).await, "canceled");
}

#[tokio::test]
async fn a_wide_fan_in_is_released_exactly_once() {
    let (db, workflows) = set_up().await;
    let upstream = db.enqueue(2000, serde_json::json!({})).await;
    let sink = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after(upstream.clone()))
        .await
        .unwrap()
        .id();
    assert_eq!(db.state(sink).await, "pending");
    // Count every transition of the sink to queued: exactly one release.
    db.execute(
        "CREATE TABLE releases (job_id bigint);
         CREATE FUNCTION count_release() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO releases VALUES (NEW.id); RETURN NULL; END $$;
         CREATE TRIGGER count_release AFTER UPDATE OF state ON jobs FOR EACH ROW
           WHEN (OLD.state = 'pending' AND NEW.state = 'queued') EXECUTE FUNCTION count_release();",
    )
    .await;
    let started = Instant::now();
    run_until_done(&db, 2, 16, None).await;
    let fan_in = started.elapsed();
    assert_eq!(db.count("completed").await, 2001);
    assert_eq!(runs(&db, sink).await, 1);
    assert_released_once_after_the_rest(&db, sink).await;
    // The same burn-down without the dependent, for the record (the ratio is
    // what counts; both run on this machine, now).
    db.enqueue(2000, serde_json::json!({})).await;
    let started = Instant::now();
    run_until_done(&db, 2, 16, None).await;
    eprintln!(
        "2,000 jobs released into a 2,000-wide fan-in: {fan_in:?}; 2,000 plain jobs: {:?}",
        started.elapsed()
    );
}

/// Asserts that `sink` was released once (the `releases` table of the test's
/// counting trigger) and ran after every other job of the table finished.
async fn assert_released_once_after_the_rest(db: &Db, sink: i64) {
    let releases: i64 = sqlx::query_scalar("SELECT count(*) FROM releases")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(releases, 1, "the sink was released once");
    let (sink_ran, _) = times(db, sink).await;
    let last_upstream: i64 = sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM max(finished_at)) * 1e6)::bigint FROM jobs WHERE id <> $1",
    )
    .bind(sink)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        sink_ran >= last_upstream,
        "the sink ran after the last upstream finished"
    );
}

/// A transaction that gives up on a lock after 1 s: a write that should not
/// wait for a lock held elsewhere fails instead of hanging.
pub(crate) async fn begin_impatient(db: &Db) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '1s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Completes job `id` in a transaction left open, as a mark would.
pub(crate) async fn complete_in(tx: &mut sqlx::PgConnection, id: i64) {
    sqlx::query(
        "UPDATE jobs SET state = 'completed', finished_at = clock_timestamp() WHERE id = $1",
    )
    .bind(id)
    .execute(tx)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_last_two_completions_racing_release_the_dependent_once() {
    let (db, workflows) = set_up().await;
    for first_commits_first in [true, false] {
        let up = db.enqueue(2, serde_json::json!({})).await;
        let sink = workflows
            .enqueuer()
            .enqueue(&NewJob::new().after(up.clone()))
            .await
            .unwrap()
            .id();
        // Both completions run before either commits: each deletes its edge
        // while the other's is still visible to it.
        let mut one = db.pool.begin().await.unwrap();
        complete_in(&mut one, up[0]).await;
        let pool = db.pool.clone();
        let second = up[1];
        let (ready, wait) = tokio::sync::oneshot::channel::<()>();
        let two = tokio::spawn(async move {
            let mut two = pool.begin().await.unwrap();
            complete_in(&mut two, second).await;
            wait.await.unwrap();
            two.commit().await.unwrap();
        });
        // The second completion waits on the first's lock on its edge; give it
        // time to get there.
        tokio::time::sleep(Duration::from_millis(200)).await;
        if first_commits_first {
            one.commit().await.unwrap();
            ready.send(()).unwrap();
            two.await.unwrap();
        } else {
            ready.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            one.commit().await.unwrap();
            two.await.unwrap();
        }
        assert_eq!(db.state(sink).await, "queued", "released, not stranded");
    }
}

#[tokio::test]
async fn fan_in_completions_do_not_wait_for_each_other() {
    let (db, workflows) = set_up().await;
    let up = db.enqueue(50, serde_json::json!({})).await;
    let sink = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after(up.clone()))
        .await
        .unwrap()
        .id();
    // Forty open transactions, each having completed one upstream job: none
    // waits for another (a counter row would make each wait for the last).
    let mut open = Vec::new();
    for &id in &up[..40] {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("SET LOCAL lock_timeout = '2s'")
            .execute(&mut *tx)
            .await
            .unwrap();
        complete_in(&mut tx, id).await;
        open.push(tx);
    }
    for tx in open {
        tx.commit().await.unwrap();
    }
    assert_eq!(db.state(sink).await, "pending");
    for &id in &up[40..] {
        complete_in(&mut db.pool.acquire().await.unwrap(), id).await;
    }
    assert_eq!(db.state(sink).await, "queued");
}

#[tokio::test]
async fn a_release_with_no_edge_left_takes_no_lock_on_the_dependent_first() {
    let (db, workflows) = set_up().await;
    let up = db.enqueue(1, serde_json::json!({})).await;
    let next = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after(up.clone()))
        .await
        .unwrap()
        .id();
    // A key-share lock on the dependent (what a foreign key's check takes)
    // blocks `FOR UPDATE`, not the release's own `UPDATE`: a completion that
    // sees no other edge releases with that `UPDATE` alone, and does not wait.
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR KEY SHARE")
        .bind(next)
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut tx = begin_impatient(&db).await;
    complete_in(&mut tx, up[0]).await;
    tx.commit().await.unwrap();
    holder.commit().await.unwrap();
    assert_eq!(db.state(next).await, "queued");
}

/// Transactional handling: the first attempt of a job whose payload says
/// `"kill": true` terminates its own transaction's backend after its write,
/// so its completion is lost with the connection (and rolled back).
struct KillsFirstAttempt(sqlx::PgPool);
impl Handler<DbStore<Job>> for KillsFirstAttempt {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let kill = job.record().payload["kill"] == serde_json::json!(true);
        let tx = job.tx().expect("transactional handling");
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let attempts: i64 =
            sqlx::query_scalar("INSERT INTO attempts VALUES ($1) RETURNING (SELECT count(*) + 1 FROM attempts WHERE job_id = $1)")
                .bind(id)
                .fetch_one(&self.0)
                .await?;
        if kill && attempts == 1 {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&self.0)
                .await?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_completion_lost_with_its_connection_releases_nothing_until_it_completes() {
    let (db, workflows) = set_up().await;
    db.execute("CREATE TABLE attempts (job_id bigint NOT NULL)")
        .await;
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new(
                    "a",
                    NewJob::new().json("payload", serde_json::json!({"kill": true})),
                ))
                .task(Task::new("b", NewJob::new()).after(["a"])),
        )
        .await
        .unwrap();
    let (a, b) = (wf.id_of("a").unwrap(), wf.id_of("b").unwrap());
    let s = store(&db, Handling::Transactional, 2).await;
    let mut o = WorkerOptions::new("killer");
    o.num_handlers = 2;
    o.interval = Duration::from_millis(10);
    let worker = new_worker(s, KillsFirstAttempt(db.pool.clone()), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.state(b).await != "completed" {
        assert!(Instant::now() < deadline, "b never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.graceful();
    run.await.unwrap();
    let attempts: i64 = db
        .scalar("SELECT count(*) FROM attempts WHERE job_id = $1", a)
        .await;
    assert_eq!(
        attempts, 2,
        "a's first completion was lost with its connection"
    );
    let resets: i32 = db
        .scalar("SELECT num_resets FROM jobs WHERE id = $1", a)
        .await;
    assert_eq!(resets, 1);
    assert_eq!(
        runs(&db, a).await,
        1,
        "the lost attempt's write rolled back"
    );
    assert_eq!(runs(&db, b).await, 1, "b ran once");
    let (b_ran, _) = times(&db, b).await;
    let (_, a_finished) = times(&db, a).await;
    assert!(
        b_ran >= a_finished,
        "b ran after a's second attempt finished"
    );
}

#[tokio::test]
async fn a_job_failed_by_the_resetter_cancels_its_dependents() {
    let (db, workflows) = set_up().await;
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("a", NewJob::new()))
                .task(Task::new("b", NewJob::new()).after(["a"])),
        )
        .await
        .unwrap();
    let (a, b) = (wf.id_of("a").unwrap(), wf.id_of("b").unwrap());
    // A claimed job whose worker died, reset too often already.
    sqlx::query(
        "UPDATE jobs SET state = 'processing', started_at = now(), num_resets = 100,
                last_heartbeat_at = now() - interval '1 hour' WHERE id = $1",
    )
    .bind(a)
    .execute(&db.pool)
    .await
    .unwrap();
    let s = store(&db, Handling::Heartbeat, 2).await;
    s.reset_stalled().await.unwrap();
    assert_eq!(db.state(a).await, "failed");
    assert_eq!(db.state(b).await, "canceled");
}

#[tokio::test]
async fn a_release_notifies_listening_workers() {
    let (db, workflows) = set_up().await;
    db.execute(&dbworker::ddl::notify_trigger_sql("jobs", &HashMap::new(), None).unwrap())
        .await;
    let upstream = db.enqueue(1, serde_json::json!({})).await[0];
    let dependent = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after([upstream]))
        .await
        .unwrap()
        .id();
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener
        .listen(&dbworker::default_notify_channel("jobs").unwrap())
        .await
        .unwrap();
    complete_in(&mut db.pool.acquire().await.unwrap(), upstream).await;
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification for the released job")
        .unwrap();
    assert!(note.channel().starts_with("dbworker_"));
    assert_eq!(db.state(dependent).await, "queued");
}

/// `NewJob::after` from SQL: `jobs_wait_for(job, after, policy)` makes a job
/// queued in the same transaction wait, counts finished upstreams at once, and
/// refuses what it cannot do.
#[tokio::test]
async fn the_sql_wait_for_function_makes_a_new_job_wait() {
    let (db, _workflows) = set_up().await;
    let insert = |state: &'static str| {
        let pool = db.pool.clone();
        async move {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO jobs (state, finished_at) VALUES ($1, CASE WHEN $1 = 'queued' THEN NULL ELSE now() END) RETURNING id",
            )
            .bind(state)
            .fetch_one(&pool)
            .await
            .unwrap();
            id
        }
    };
    let (a, done, failed) = (
        insert("queued").await,
        insert("completed").await,
        insert("failed").await,
    );
    let wait = |after: Vec<i64>, policy: &'static str| {
        let pool = db.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let id: i64 = sqlx::query_scalar("INSERT INTO jobs DEFAULT VALUES RETURNING id")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            let state: String = sqlx::query_scalar("SELECT jobs_wait_for($1, $2, $3)")
                .bind(id)
                .bind(after)
                .bind(policy)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            (id, state)
        }
    };
    let (d, state) = wait(vec![a, done], "cancel").await;
    assert_eq!(state, "pending", "waits for a, not for the completed one");
    let edges: i64 = db
        .scalar("SELECT count(*) FROM jobs_deps WHERE job_id = $1", d)
        .await;
    assert_eq!(edges, 1);
    let (canceled, state) = wait(vec![failed], "cancel").await;
    assert_eq!(state, "canceled", "a failed upstream cancels it at once");
    let blocked: Option<i64> = sqlx::query_scalar("SELECT blocked_by FROM jobs WHERE id = $1")
        .bind(canceled)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(blocked, Some(failed));
    let (_, state) = wait(vec![failed], "ignore_failed").await;
    assert_eq!(state, "queued", "ignore_failed lets it run");

    // A job that is not queued, an unknown upstream and a bad policy are refused.
    for (sql, why) in [
        (
            format!("SELECT jobs_wait_for({done}, ARRAY[{a}])"),
            "not a queued job",
        ),
        (
            format!("SELECT jobs_wait_for({a}, ARRAY[987654])"),
            "does not exist",
        ),
        (
            format!("SELECT jobs_wait_for({a}, ARRAY[{done}], 'sometimes')"),
            "policy must be",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&db.pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{err}");
    }

    run_until_done(&db, 1, 2, None).await;
    assert_eq!(db.state(d).await, "completed");
    let (a_times, d_times) = (times(&db, a).await, times(&db, d).await);
    assert!(d_times.0 >= a_times.1, "d started after a finished");
}

/// Heartbeat handling writes completions in groups, each group one statement
/// whose release trigger runs inside it. Backends writing such groups are
/// terminated mid-statement (every completion is slowed by a trigger so the
/// kills land inside the statement): each killed group rolls back with its
/// releases, the store writes its marks again or the resetter requeues them,
/// and the fan-in's sink still runs once, after every upstream job completed.
#[tokio::test]
async fn backends_killed_during_grouped_marks_of_a_fan_in_strand_nothing() {
    let (db, workflows) = set_up().await;
    let upstream = db.enqueue(300, serde_json::json!({})).await;
    let sink = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after(upstream.clone()))
        .await
        .unwrap()
        .id();
    db.execute(
        "CREATE TABLE releases (job_id bigint);
         CREATE FUNCTION count_release() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO releases VALUES (NEW.id); RETURN NULL; END $$;
         CREATE TRIGGER count_release AFTER UPDATE OF state ON jobs FOR EACH ROW
           WHEN (OLD.state = 'pending' AND NEW.state = 'queued') EXECUTE FUNCTION count_release();
         CREATE FUNCTION slow_completion() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$;
         CREATE TRIGGER slow_completion BEFORE UPDATE OF state ON jobs FOR EACH ROW
           WHEN (NEW.state = 'completed') EXECUTE FUNCTION slow_completion();",
    )
    .await;
    let mut so: StoreOptions = Db::options_for_tests();
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(3);
    let table = table(&db).await;
    let pool = db.db.pool(20).await.unwrap();
    // The store's resetter: its stall options, every 500 ms.
    let mut ro = ResetterOptions::new(format!("{}_resetter", so.name));
    ro.stall = so.stall.clone();
    ro.interval = Duration::from_millis(500);
    let s = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let resetter = Resetter::new(&pool, &table, ro).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let resetting = {
        let stop = stop.clone();
        tokio::spawn(async move { dbworker::Service::run(&resetter, stop).await })
    };
    // Terminates the backends of grouped completions (the statement names its
    // `dbworker_marks` rows), a few of them, while the fan-in completes.
    let killing = {
        let (pool, stop) = (db.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut killed = 0;
            while killed < 6 && !stop.is_cancelled() {
                let pids: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()
                       AND pid <> pg_backend_pid() AND state = 'active'
                       AND query LIKE '%dbworker_marks%' AND query LIKE '%completed%'",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                for pid in pids {
                    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    killed += usize::from(done);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            killed
        })
    };
    let mut o = WorkerOptions::new("grouped");
    o.num_handlers = 16;
    o.interval = Duration::from_millis(10);
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    let worker = new_worker(s, Recorder(db.pool.clone()), o).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    db.wait_until_no_live_job(Duration::from_secs(120)).await;
    shutdown.graceful();
    run.await.unwrap();
    stop.cancel();
    resetting.await.unwrap().unwrap();
    let killed = killing.await.unwrap();
    assert!(killed > 0, "no grouped mark was caught mid-statement");
    assert_eq!(db.count("completed").await, 301, "nothing stranded");
    assert_eq!(runs(&db, sink).await, 1, "the sink ran once");
    let deps_left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(deps_left, 0);
    assert_released_once_after_the_rest(&db, sink).await;
    eprintln!("terminated {killed} backends writing grouped completions");
}

/// A new job waiting for `upstream` (policy `cancel`); returns its id.
pub(crate) async fn after(workflows: &Workflows, upstream: &[i64]) -> i64 {
    workflows
        .enqueuer()
        .enqueue(&NewJob::new().after(upstream.to_vec()))
        .await
        .unwrap()
        .id()
}

/// A canceled dependent's `finished_at` comes after the write that canceled
/// it, even when that write's transaction started long before (a
/// transactional handler's): the trigger stamps it with the clock, not with
/// the transaction's start.
#[tokio::test]
async fn a_dependent_canceled_in_a_long_transaction_finishes_after_its_upstream() {
    let (db, workflows) = set_up().await;
    let a = db.enqueue(1, serde_json::json!({})).await[0];
    let d = after(&workflows, &[a]).await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_sleep(0.2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = clock_timestamp() WHERE id = $1")
        .bind(a)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.state(d).await, "canceled");
    let in_order: bool = sqlx::query_scalar(
        "SELECT (SELECT finished_at FROM jobs WHERE id = $2) >= (SELECT finished_at FROM jobs WHERE id = $1)",
    )
    .bind(a)
    .bind(d)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(in_order, "the dependent finished after its upstream");
}

/// Finishes job `id` in `state` (failed, canceled, completed) with plain SQL,
/// as any write that finishes it would.
pub(crate) async fn finish(db: &Db, id: i64, state: &str) {
    sqlx::query("UPDATE jobs SET state = $2, finished_at = clock_timestamp() WHERE id = $1")
        .bind(id)
        .bind(state)
        .execute(&db.pool)
        .await
        .unwrap();
}

pub(crate) async fn blocked_by(db: &Db, id: i64) -> Option<i64> {
    db.scalar("SELECT blocked_by FROM jobs WHERE id = $1", id)
        .await
}

/// A failed upstream deleted afterwards (retention, `dbworker delete`) will
/// never complete: when another upstream of the same dependent is retried,
/// the dependent stays canceled, naming the deleted one, instead of waiting
/// forever for it. The delete made that for good (no `blocked_by`), see
/// `deletes.rs`.
#[tokio::test]
async fn a_deleted_failed_upstream_still_blocks_when_another_is_retried() {
    let (db, workflows) = set_up().await;
    let up = db.enqueue(2, serde_json::json!({})).await;
    let (a, b) = (up[0], up[1]);
    let d = after(&workflows, &[a, b]).await;
    finish(&db, b, "failed").await;
    assert_eq!(blocked_by(&db, d).await, Some(b));
    finish(&db, a, "failed").await;
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    let deleted = admin
        .act_on_ids(&[a], &dbworker::admin::BulkAction::Delete)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(admin.requeue(b).await.unwrap());
    assert_eq!(db.state(d).await, "canceled", "not pending, stranded");
    assert_eq!(blocked_by(&db, d).await, None, "no retry brings it back");
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", d)
        .await;
    assert_eq!(message, format!("upstream job {a} was deleted"));
    finish(&db, b, "completed").await;
    assert_eq!(db.state(d).await, "canceled", "b alone does not release it");
}

/// Completing a failed upstream by hand (`Admin`'s complete) satisfies its
/// edges as a completion does: what its failure canceled waits again, and
/// runs once nothing else holds it, instead of staying canceled for good.
#[tokio::test]
async fn completing_a_failed_upstream_by_hand_releases_what_it_canceled() {
    let (db, workflows) = set_up().await;
    let up = db.enqueue(3, serde_json::json!({})).await;
    let (a, b, c) = (up[0], up[1], up[2]);
    let only_a = after(&workflows, &[a]).await;
    let and_b = after(&workflows, &[a, b]).await;
    let and_c = after(&workflows, &[a, c]).await;
    let below = after(&workflows, &[only_a]).await;
    finish(&db, a, "failed").await;
    finish(&db, c, "failed").await;
    for d in [only_a, and_b, and_c] {
        assert_eq!(blocked_by(&db, d).await, Some(a));
    }
    assert_eq!(db.state(below).await, "canceled", "down the graph");
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    let done = admin
        .act_on_ids(&[a], &dbworker::admin::BulkAction::Complete)
        .await
        .unwrap();
    assert_eq!(done, 1);
    assert_eq!(db.state(only_a).await, "queued", "nothing else to wait for");
    assert_eq!(blocked_by(&db, only_a).await, None);
    assert_eq!(db.state(below).await, "pending", "waits for only_a again");
    assert_eq!(db.state(and_b).await, "pending", "waits for b");
    assert_eq!(db.state(and_c).await, "canceled", "c still blocks it");
    assert_eq!(blocked_by(&db, and_c).await, Some(c));
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", and_c)
        .await;
    assert_eq!(message, format!("upstream job {c} was failed"));
    finish(&db, b, "completed").await;
    assert_eq!(db.state(and_b).await, "queued");
}

/// An operator's requeue or reschedule of a canceled dependent never queues
/// it ahead of its upstream: while an edge to an existing upstream job is
/// left (failed and not retried, or canceled by hand while it waited) it goes
/// back to `pending` and runs only once that job completes. An edge to a
/// deleted upstream goes with the requeue (that job can never complete).
#[tokio::test]
async fn requeuing_a_canceled_dependent_makes_it_wait_for_its_upstream() {
    use dbworker::admin::{BulkAction, Reschedule};
    let (db, workflows) = set_up().await;
    let up = db.enqueue(4, serde_json::json!({})).await;
    let (failed, live, deleted, other) = (up[0], up[1], up[2], up[3]);
    let on_failed = after(&workflows, &[failed]).await;
    let on_live = after(&workflows, &[live]).await;
    let on_deleted = after(&workflows, &[deleted]).await;
    let on_deleted_and_other = after(&workflows, &[deleted, other]).await;
    let admin = Admin::new(&db.pool, &table(&db).await).await.unwrap();
    finish(&db, failed, "failed").await;
    admin.cancel(on_live).await.unwrap();
    finish(&db, deleted, "failed").await;
    admin
        .act_on_ids(&[deleted], &BulkAction::Delete)
        .await
        .unwrap();
    for d in [on_failed, on_live, on_deleted, on_deleted_and_other] {
        assert_eq!(db.state(d).await, "canceled");
    }

    assert!(admin.requeue(on_failed).await.unwrap());
    assert_eq!(db.state(on_failed).await, "pending", "its upstream failed");
    assert_eq!(blocked_by(&db, on_failed).await, None);
    let reschedule = BulkAction::Reschedule(Reschedule::default());
    assert_eq!(admin.act_on_ids(&[on_live], &reschedule).await.unwrap(), 1);
    assert_eq!(db.state(on_live).await, "pending", "its upstream is queued");
    let requeue = BulkAction::Requeue;
    let both = [on_deleted, on_deleted_and_other];
    assert_eq!(admin.act_on_ids(&both, &requeue).await.unwrap(), 2);
    assert_eq!(
        db.state(on_deleted).await,
        "queued",
        "nothing left to wait for"
    );
    assert_eq!(db.state(on_deleted_and_other).await, "pending");

    // Each runs once its upstream completes: a retry of the failed one, the
    // queued ones as they are.
    assert!(admin.requeue(failed).await.unwrap());
    assert_eq!(db.state(on_failed).await, "pending");
    run_until_done(&db, 1, 4, Some(Handling::Heartbeat)).await;
    for (d, u) in [
        (on_failed, failed),
        (on_live, live),
        (on_deleted_and_other, other),
    ] {
        assert_eq!(db.state(d).await, "completed");
        assert!(
            times(&db, d).await.0 >= times(&db, u).await.1,
            "{d} after {u}"
        );
    }
}

/// Sets job `id` to `state` in a transaction left open, as an operator's
/// retry (`queued`) or a worker's failure would be before its commit.
async fn set_in(tx: &mut sqlx::PgConnection, id: i64, state: &str) {
    sqlx::query("UPDATE jobs SET state = $2, finished_at = clock_timestamp() WHERE id = $1")
        .bind(id)
        .bind(state)
        .execute(tx)
        .await
        .unwrap();
}

/// Runs `first` (job, state) in a transaction, then `second` in another
/// while the first is still open, then commits the first and waits for the
/// second (which may have waited for it).
pub(crate) async fn overlap(db: &Db, first: (i64, &str), second: (i64, &'static str)) {
    let mut one = db.pool.begin().await.unwrap();
    set_in(&mut one, first.0, first.1).await;
    let pool = db.pool.clone();
    let two = tokio::spawn(async move {
        let mut two = pool.begin().await.unwrap();
        set_in(&mut two, second.0, second.1).await;
        two.commit().await.unwrap();
    });
    // Time for the second to reach a lock the first holds, if it takes one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    one.commit().await.unwrap();
    two.await.unwrap();
}

/// A retry of one upstream and the failure of another, at once, in either
/// order: the dependent ends canceled, blocked by the one that failed, never
/// pending behind a failed job that nothing will retry.
#[tokio::test]
async fn a_retry_racing_another_upstreams_failure_leaves_the_dependent_canceled() {
    let (db, workflows) = set_up().await;
    for retry_first in [true, false] {
        let up = db.enqueue(2, serde_json::json!({})).await;
        let (a, b) = (up[0], up[1]);
        let d = after(&workflows, &[a, b]).await;
        finish(&db, a, "failed").await;
        assert_eq!(blocked_by(&db, d).await, Some(a));
        if retry_first {
            overlap(&db, (a, "queued"), (b, "failed")).await;
        } else {
            overlap(&db, (b, "failed"), (a, "queued")).await;
        }
        assert_eq!(db.state(d).await, "canceled", "retry first: {retry_first}");
        assert_eq!(blocked_by(&db, d).await, Some(b));
        let message: String = db
            .scalar("SELECT failure_message FROM jobs WHERE id = $1", d)
            .await;
        assert_eq!(message, format!("upstream job {b} was failed"));
    }
}

/// Retries of both failed upstream jobs at once: the dependent waits again,
/// whichever commits first, never canceled by a job that is being retried.
#[tokio::test]
async fn two_retries_racing_bring_the_dependent_back() {
    let (db, workflows) = set_up().await;
    for first_blocker in [0, 1] {
        let up = db.enqueue(2, serde_json::json!({})).await;
        let d = after(&workflows, &up).await;
        let (blocker, other) = (up[first_blocker], up[1 - first_blocker]);
        finish(&db, blocker, "failed").await;
        finish(&db, other, "failed").await;
        assert_eq!(blocked_by(&db, d).await, Some(blocker));
        overlap(&db, (blocker, "queued"), (other, "queued")).await;
        assert_eq!(db.state(d).await, "pending", "round {first_blocker}");
        assert_eq!(blocked_by(&db, d).await, None);
    }
}

/// `<table>_reschedule_jobs` (the SQL admin function) does as `Admin` does:
/// a canceled dependent whose upstream failed goes back to `pending`.
#[tokio::test]
async fn the_sql_reschedule_function_makes_a_canceled_dependent_wait() {
    let (db, workflows) = set_up().await;
    db.execute(
        &dbworker::ddl::admin_functions_sql("jobs", &HashMap::new(), Default::default()).unwrap(),
    )
    .await;
    let up = db.enqueue(2, serde_json::json!({})).await;
    let (failed, deleted) = (up[0], up[1]);
    let waits = after(&workflows, &[failed]).await;
    let free = after(&workflows, &[deleted]).await;
    finish(&db, failed, "failed").await;
    finish(&db, deleted, "failed").await;
    db.execute(&format!("DELETE FROM jobs WHERE id = {deleted}"))
        .await;
    let outcomes: Vec<(i64, String)> = sqlx::query_as("SELECT * FROM jobs_reschedule_jobs($1)")
        .bind(vec![waits, free])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(outcomes, [(waits, "done".into()), (free, "done".into())]);
    assert_eq!(db.state(waits).await, "pending", "its upstream failed");
    assert_eq!(blocked_by(&db, waits).await, None);
    assert_eq!(db.state(free).await, "queued", "its upstream is gone");
}

/// A requeue of a canceled dependent racing the completion of its upstream
/// job: the requeue waits for that commit and finds the edge gone, so the
/// dependent is queued, not left pending with nothing to release it.
#[tokio::test]
async fn a_requeue_racing_the_upstreams_completion_queues_the_dependent() {
    let (db, workflows) = set_up().await;
    db.execute(
        &dbworker::ddl::admin_functions_sql("jobs", &HashMap::new(), Default::default()).unwrap(),
    )
    .await;
    let admin = Arc::new(Admin::new(&db.pool, &table(&db).await).await.unwrap());
    for by_function in [false, true] {
        let a = db.enqueue(1, serde_json::json!({})).await[0];
        let d = after(&workflows, &[a]).await;
        admin.cancel(d).await.unwrap();
        let mut completion = db.pool.begin().await.unwrap();
        complete_in(&mut completion, a).await;
        let (admin, pool) = (admin.clone(), db.pool.clone());
        let requeue = tokio::spawn(async move {
            if by_function {
                sqlx::query("SELECT * FROM jobs_reschedule_jobs($1)")
                    .bind(vec![d])
                    .execute(&pool)
                    .await
                    .unwrap();
            } else {
                assert!(admin.requeue(d).await.unwrap());
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        completion.commit().await.unwrap();
        requeue.await.unwrap();
        assert_eq!(db.state(d).await, "queued", "by function: {by_function}");
    }
}

/// A new dependent canceled at once (its upstream already failed) inside a
/// caller's transaction that began long before has `finished_at` from the
/// clock, not from that transaction's start. Before, `now()`.
#[tokio::test]
async fn a_dependent_canceled_at_enqueue_in_a_long_transaction_stamps_the_current_time() {
    let (db, workflows) = set_up().await;
    let a = db.enqueue(1, serde_json::json!({})).await[0];
    finish(&db, a, "failed").await;
    let (mut tx, before) = db.long_transaction().await;
    let d = workflows
        .enqueuer()
        .enqueue_in(&mut tx, NewJob::new().after([a]))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    assert_eq!(db.state(d).await, "canceled");
    let finished: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM finished_at)::float8 FROM jobs WHERE id = $1",
    )
    .bind(d)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        finished >= before,
        "finished {:.2} s before the enqueue",
        before - finished
    );
}

/// A workflow's cancel that waited for a transaction writing its tasks'
/// rows stamps `finished_at` with the time it wrote them. Before, `now()`:
/// the start of its transaction, 1.5 s early here.
#[tokio::test]
async fn a_workflow_cancel_that_waited_for_a_rows_lock_stamps_the_time_it_wrote_it() {
    let (db, workflows) = set_up().await;
    let wf = workflows.enqueue(&diamond()).await.unwrap();
    let ids: Vec<i64> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| wf.id_of(n).unwrap())
        .collect();
    let acting = {
        let workflows = workflows.clone();
        async move { workflows.cancel(wf.id).await.unwrap().canceled }
    };
    let (canceled, released) = db.after_row_locks(&ids, acting).await;
    assert_eq!(canceled, 4);
    for id in ids {
        let finished = db.finished_at(id).await;
        assert!(
            finished >= released,
            "job {id} finished {:.2} s before the cancel wrote it",
            released - finished
        );
    }
}
