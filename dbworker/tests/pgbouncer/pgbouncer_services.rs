//! The services beside the worker, through PgBouncer in transaction mode
//! (`Pooler::Transaction` without a listen URL, so whatever would listen
//! polls): a purger pass (plain and fenced by a leader's term), a paused
//! queue is not claimed, a processing limit holds across two processes, two
//! processes of a log consumer group project every event once, and the
//! dashboard's main pages and an action. Skipped, saying why, without
//! pgbouncer (.ci/run installs it).

use crate::common;
use crate::fixtures::consumers;
use crate::fixtures::dashboard;
use crate::fixtures::purge;
use crate::fixtures::router;

use dbworker_testkit::pgbouncer as bouncer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dbworker::{
    DbConditions, DbJob, DbStore, Enqueuer, Handling, JobTable, JobTableOptions, NewJob, Pooler,
    StoreOptions,
    cluster::{DEFAULT_LEADER_TABLE, LeaderElection, LeaderOptions},
    control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, Limits, Pauses, PausesOptions},
    dashboard::{Auth, Dashboard, DashboardOptions},
    ddl::{leader_table_sql, limit_table_sql, pause_table_sql},
    maintenance::{PurgeOptions, Purger},
    new_worker,
};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use workerutil::{Handler, HandlerError, JobContext, JobState, Store, WorkerOptions};

use crate::POOLER;
use bouncer::Bouncer;
use common::{Db, QueuedJob};
use router::get;

/// Every test here runs behind the pooler (each holding `POOLER`), without a listen URL, after
/// another sqlx program left its named statements on every server
/// connection (`sqlx_s_1`, ...): nothing of dbworker's may collide with them.
async fn behind_pgbouncer(db: &Db, test: &str) -> Option<Bouncer> {
    let bouncer = Bouncer::start_or_skip(test, db.db.url(), 6)?;
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    assert_eq!(bouncer.leave_named_statements().await, 60);
    Some(bouncer)
}

fn assert_no_errors(bouncer: &Bouncer) {
    let log = bouncer.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}

#[tokio::test]
async fn a_purger_pass_runs_through_pgbouncer_alone_and_as_leader() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    let Some(bouncer) = behind_pgbouncer(&db, "the purger through PgBouncer").await else {
        return;
    };
    db.execute(&leader_table_sql(DEFAULT_LEADER_TABLE).unwrap())
        .await;
    purge::seed(&db).await;
    let pool = bouncer.pool(4).await;
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let mut o = PurgeOptions::new();
    o.chunk_size = 2;
    let purger = Purger::new(&pool, &table, o).await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(
        purged.by_state,
        [
            (JobState::Completed, 5),
            (JobState::Failed, 3),
            (JobState::Canceled, 1)
        ]
    );

    // As a leader: each batch fenced by the term, in its own transaction.
    purge::seed(&db).await;
    let election = LeaderElection::new(&pool, LeaderOptions::new("jobs", "node-a"))
        .await
        .unwrap();
    let purged = Arc::new(std::sync::Mutex::new(None));
    let stop = CancellationToken::new();
    let run = {
        let (purged, stop, purger) = (purged.clone(), stop.clone(), purger.clone());
        tokio::spawn(async move {
            election
                .run(stop.clone(), move |leadership| {
                    let (purged, stop, purger) = (purged.clone(), stop.clone(), purger.clone());
                    async move {
                        let out = purger.purge_once_as_leader(&leadership).await;
                        *purged.lock().unwrap() = Some(out.map(|p| p.by_state));
                        stop.cancel();
                    }
                })
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the leader purged")
        .unwrap();
    let by_state = purged.lock().unwrap().take().unwrap().unwrap();
    assert_eq!(
        by_state,
        [
            (JobState::Completed, 5),
            (JobState::Failed, 3),
            (JobState::Canceled, 1)
        ]
    );
    assert_no_errors(&bouncer);
}

/// The job table with a queue column, the pause and limit tables.
fn controlled(relation: &str) -> JobTableOptions {
    let mut t = JobTableOptions::new(relation);
    t.queue_column = Some("queue".into());
    t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
    t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    t
}

async fn controlled_store(pool: &sqlx::PgPool) -> Arc<DbStore<QueuedJob>> {
    let table = JobTable::new(pool, controlled("jobs j")).await.unwrap();
    let mut o = StoreOptions::new("controlled");
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    Arc::new(DbStore::new(pool, &table, o).await.unwrap())
}

/// Counts the `reports` jobs running at once across every worker.
#[derive(Default)]
struct Counter {
    now: AtomicUsize,
    most: AtomicUsize,
}
impl Handler<DbStore<QueuedJob>> for Counter {
    async fn handle(
        &self,
        job: &mut DbJob<QueuedJob>,
        _ctx: &JobContext<DbStore<QueuedJob>>,
    ) -> Result<(), HandlerError> {
        let reports = job.record().queue == "reports";
        if reports {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if reports {
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_is_not_claimed_and_a_limit_holds_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let db = Db::new().await;
    let Some(bouncer) = behind_pgbouncer(&db, "pauses and limits through PgBouncer").await else {
        return;
    };
    db.add_columns(
        |c| c.queue = true,
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
        ],
    )
    .await;
    let pool = bouncer.pool(8).await;
    let table = JobTable::new(&pool, controlled("jobs")).await.unwrap();
    let enqueuer = Enqueuer::new(&pool, &table).await.unwrap();
    let pauses = Pauses::new(&pool, &table, PausesOptions::default())
        .await
        .unwrap();
    let limits = Limits::new(&pool, &table).await.unwrap();

    // Paused: not claimed, by this store or another process's.
    let ids = enqueuer
        .enqueue_many(&[NewJob::new().queue("emails"), NewJob::new().queue("held")])
        .await
        .unwrap();
    assert!(pauses.pause(Some("held"), "ops").await.unwrap());
    let (a, b) = (
        controlled_store(&pool).await,
        controlled_store(&bouncer.pool(8).await).await,
    );
    let claim = async |store: &DbStore<QueuedJob>| -> Vec<i64> {
        let jobs = store
            .dequeue("host", &DbConditions::new(), 10)
            .await
            .unwrap();
        jobs.iter().map(|j| j.record().id).collect()
    };
    assert_eq!(claim(&a).await, [ids[0]], "only the queue not paused");
    assert!(claim(&b).await.is_empty(), "the other process skips it too");
    assert!(pauses.resume(Some("held")).await.unwrap());
    assert_eq!(claim(&b).await, [ids[1]], "claimed once resumed");
    db.execute("DELETE FROM jobs").await;

    // A limit of 2 on `reports`, two processes of eight handlers each.
    limits.set("reports", 2).await.unwrap();
    let mut jobs: Vec<NewJob> = (0..40).map(|_| NewJob::new().queue("reports")).collect();
    jobs.extend((0..80).map(|_| NewJob::new().queue("emails")));
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let counter = Arc::new(Counter::default());
    let mut runs = Vec::new();
    for store in [a, b] {
        let mut o = WorkerOptions::new("limited");
        o.num_handlers = 8;
        o.interval = Duration::from_millis(20);
        let worker = new_worker(store, counter.clone(), o).unwrap();
        runs.push(tokio::spawn(worker.run_until_empty()));
    }
    db.wait_until_no_live_job(Duration::from_secs(60)).await;
    for run in runs {
        run.await.unwrap();
    }
    assert_eq!(db.count("completed").await, 120);
    assert_eq!(
        counter.most.load(Ordering::SeqCst),
        2,
        "the limit is used, never exceeded"
    );
    assert_no_errors(&bouncer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_log_consumer_processes_project_every_event_once_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let db = consumers::set_up().await;
    let Some(bouncer) = behind_pgbouncer(&db, "log consumers through PgBouncer").await else {
        return;
    };
    let (one, two) = (
        consumers::Project::new("one"),
        consumers::Project::new("two"),
    );
    let both = || {
        dbworker::consumers::Consumers::new()
            .add(one.clone())
            .add(two.clone())
    };
    let a = consumers::start_on(bouncer.pool(6).await, both(), consumers::fast_group()).await;
    let b = consumers::start_on(bouncer.pool(6).await, both(), consumers::fast_group()).await;
    consumers::append(&db, 300).await;
    consumers::wait_for("every event projected", async || {
        consumers::projected(&db, "one").await == 300
            && consumers::projected(&db, "two").await == 300
    })
    .await;
    let owners: Vec<String> = consumers::assignments(&db)
        .await
        .into_iter()
        .map(|(_, node)| node)
        .collect();
    assert_eq!(owners.len(), 2, "each consumer assigned once: {owners:?}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    assert_no_errors(&bouncer);
}

#[tokio::test]
async fn the_dashboard_serves_its_pages_and_actions_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let (db, failed) = dashboard::seed().await;
    let Some(bouncer) = behind_pgbouncer(&db, "the dashboard through PgBouncer").await else {
        return;
    };
    let pool = bouncer.pool(4).await;
    let mut t = controlled("jobs");
    t.kind_column = Some("kind".into());
    let table = JobTable::new(&pool, t).await.unwrap();
    let mut o = DashboardOptions::new(vec![table]);
    o.auth = Auth::None;
    let app = Dashboard::new(&pool, o).await.unwrap().router();

    let (status, page) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<td>mail</td>"), "{page}");
    let (status, page) = get(&app, "/t/jobs/jobs?state=queued").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page.matches("type=\"checkbox\"").count(), 30, "{page}");
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{failed}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("build"), "{page}");
    let (status, page) = get(&app, "/t/jobs/queues").await;
    assert_eq!(status, StatusCode::OK, "{page}");

    // An action: requeue the failed job.
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a token")
        + 19;
    let token = page[at..at + 32].to_owned();
    let res = app
        .clone()
        .oneshot(
            Request::post(format!("/t/jobs/jobs/{failed}/action"))
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::HOST, "localhost")
                .header(header::ORIGIN, "http://localhost")
                .header("sec-fetch-site", "same-origin")
                .body(Body::from(format!("action=requeue&csrf={token}")))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(res.status().is_redirection(), "{}", res.status());
    assert_eq!(db.state(failed).await, "queued");
    assert_no_errors(&bouncer);
}

/// A column of a type sqlx does not know (an enum added after the store
/// started, so no connection has looked it up yet) read in a slice's
/// transaction: sqlx's type lookup must not discard the slice's statement.
#[tokio::test]
async fn a_slice_with_a_column_of_a_new_type_reads_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    use dbworker::consumers::{LogOptions, LogStore};
    use workerutil::Job as _;
    let db = consumers::set_up().await;
    let Some(bouncer) = behind_pgbouncer(&db, "a new column type through PgBouncer").await else {
        return;
    };
    let mut o = LogOptions::new("log", "events e", "node-a", vec!["audit".into()]);
    o.slice_size = 5;
    // One client connection: the one the start-up check already used.
    let store = LogStore::<consumers::Event>::new(&bouncer.pool(1).await, o)
        .await
        .unwrap();
    db.execute(
        "CREATE TYPE mood AS ENUM ('calm', 'cross');
         ALTER TABLE events ADD COLUMN mood mood NOT NULL DEFAULT 'calm';
         INSERT INTO dbworker_consumer_assignments (consumer_name, node_id) VALUES ('audit', 'node-a');",
    )
    .await;
    consumers::append(&db, 3).await;
    let mut job = store
        .dequeue("node-a", &(), 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(store.open(&mut job).await.unwrap(), "the slice opened");
    assert_eq!(job.record().events.len(), 3);
    assert_no_errors(&bouncer);
}
