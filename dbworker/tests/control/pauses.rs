//! Durable pause and resume on real Postgres: a paused table or queue is
//! skipped by every store at its next claim, a resume wakes listening workers
//! at once, and a missing pause table is named at start-up. A pause set on
//! the dashboard holds for every description of the table.

use crate::TIMED;
use crate::common;
use crate::fixtures::ahead::{self, listening};
use crate::fixtures::router;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::{
    DbConditions, DbStore, Enqueuer, Handling, JobTable, Listen, NewJob,
    control::{DEFAULT_PAUSE_TABLE, Pauses, PausesOptions},
    ddl::{notify_trigger_sql, pause_table_sql},
    new_worker,
};
use workerutil::testing::wait_for;
use workerutil::{Store, WorkerEvent, WorkerOptions};

use common::{Completes, Db, Job};

async fn set_up() -> Db {
    let db = Db::new().await;
    let extra = [
        pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
        notify_trigger_sql("jobs", &Default::default(), None).unwrap(),
    ];
    db.add_columns(|c| c.queue = true, &extra).await;
    db
}

/// The test table with its queue column and the pause table.
async fn pausable_table(db: &Db) -> JobTable {
    db.table_with(|t| {
        t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        t.queue_column = Some("queue".into());
    })
    .await
}

async fn pausable_store(db: &Db, listen: bool) -> Arc<DbStore<Job>> {
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.stall.stalled_max_age = Duration::from_secs(60);
    if listen {
        o.listen = Listen::TableChannel;
    }
    let store = db.store_on(&pausable_table(db).await, o).await;
    // A listening store is returned once it listens.
    if listen {
        listening(&store).await;
    }
    store
}

async fn pauses(db: &Db) -> Pauses {
    Pauses::new(
        &db.pool,
        &pausable_table(db).await,
        PausesOptions::default(),
    )
    .await
    .unwrap()
}

async fn enqueue(db: &Db, queues: &[&str]) -> Vec<i64> {
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let jobs: Vec<NewJob> = queues.iter().map(|q| NewJob::new().queue(*q)).collect();
    enqueuer.enqueue_many(&jobs).await.unwrap()
}

async fn claim(store: &DbStore<Job>) -> Vec<i64> {
    let jobs = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    jobs.iter().map(|j| j.record().id).collect()
}

#[tokio::test]
async fn a_paused_table_or_queue_is_skipped_by_every_store_until_resumed() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let ids = enqueue(&db, &["emails", "reports", "emails", "reports"]).await;
    let store = pausable_store(&db, false).await;
    let pauses = pauses(&db).await;

    assert!(pauses.pause(None, "ops").await.unwrap());
    assert!(!pauses.pause(None, "ops").await.unwrap(), "already paused");
    assert!(claim(&store).await.is_empty());
    // Another process's store honours it too: the pause is in the database.
    let other = pausable_store(&db, false).await;
    assert!(claim(&other).await.is_empty());
    let listed = pauses.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].queue.as_deref(), listed[0].paused_by.as_str()),
        (None, "ops")
    );

    // One queue paused: the others go on.
    assert!(pauses.resume(None).await.unwrap());
    assert!(pauses.pause(Some("emails"), "ops").await.unwrap());
    assert_eq!(claim(&store).await, [ids[1], ids[3]]);
    assert!(claim(&other).await.is_empty());
    assert!(pauses.resume(Some("emails")).await.unwrap());
    assert!(
        !pauses.resume(Some("emails")).await.unwrap(),
        "not paused any more"
    );
    assert_eq!(claim(&other).await, [ids[0], ids[2]]);

    assert!(pauses.pause(Some("*"), "ops").await.is_err());
}

#[tokio::test]
async fn a_resume_wakes_a_listening_worker_at_once() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let pauses = pauses(&db).await;
    pauses.pause(None, "maintenance").await.unwrap();
    let store = pausable_store(&db, true).await;
    // Polls so rarely that a claim within seconds was woken by a notification.
    let mut o = WorkerOptions::new("paused");
    o.interval = Duration::from_secs(20);
    o.heartbeat_interval = Duration::from_millis(500);
    o.heartbeat_failure_limit = Some(Duration::from_secs(5));
    let worker = new_worker(store, Completes, o).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Idle).then_some(())
    })
    .await;
    // The insert's notification wakes it, but the table is paused.
    let id = enqueue(&db, &["emails"]).await[0];
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Idle).then_some(())
    })
    .await;
    assert_eq!(db.state(id).await, "queued");

    let resumed = Instant::now();
    assert!(pauses.resume(None).await.unwrap());
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Dequeued { id: got } if *got == id).then_some(())
    })
    .await;
    assert!(
        resumed.elapsed() < Duration::from_secs(5),
        "woken by the resume, not the 20 s poll: {:?}",
        resumed.elapsed()
    );
    shutdown.graceful();
    run.await.unwrap();
}

/// A pause table turns the claim cursor off, but a listening store still
/// probes for jobs coming due (nothing announces them) and wakes its workers;
/// a paused queue's due jobs wake nobody, as the claims leave them.
#[tokio::test]
async fn jobs_coming_due_wake_listening_workers_unless_their_queue_is_paused() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    assert!(
        pauses(&db)
            .await
            .pause(Some("emails"), "ops")
            .await
            .unwrap()
    );
    let store = pausable_store(&db, true).await;
    let mut wakeups = store.wakeups().unwrap();
    // A claim registers its conditions (none here) for the probe.
    assert!(claim(&store).await.is_empty());
    // A paused queue's job, due at once: its insert's notification wakes the
    // workers, and nothing after it (the probe looks every second).
    wakeups.mark_seen();
    enqueue(&db, &["emails"]).await;
    let notified = tokio::time::timeout(Duration::from_secs(5), wakeups.woken()).await;
    assert!(notified.is_ok(), "no wake-up from the insert");
    wakeups.mark_seen();
    let woken = tokio::time::timeout(Duration::from_secs(3), wakeups.woken()).await;
    assert!(woken.is_err(), "woken for a paused queue's job");
    // Another queue's job, due in a second: announced at its insert (not
    // due yet), then found by the probe once due.
    let scheduled = Instant::now();
    sqlx::query(
        "INSERT INTO jobs (queue, process_after) VALUES ('reports', now() + interval '1 second')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let notified = tokio::time::timeout(Duration::from_secs(5), wakeups.woken()).await;
    assert!(notified.is_ok(), "no wake-up from the insert");
    wakeups.mark_seen();
    common::woken_once_due(&mut wakeups, scheduled, Duration::from_secs(5)).await;
    assert_eq!(claim(&store).await.len(), 1, "the reports job");
}

#[tokio::test]
async fn a_missing_pause_table_or_queue_column_is_named_at_start_up() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    let mut t = Db::table_options();
    t.pause_table = Some("no_such_pauses".into());
    t.queue_column = Some("queue".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(err.contains("no_such_pauses"), "{err}");
    assert!(err.contains("queue_column"), "{err}");
    // The pause table alone (what `Pauses` needs) is named too.
    let mut t = Db::table_options();
    t.pause_table = Some("no_such_pauses".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err();
    assert!(err.to_string().contains("no_such_pauses"), "{err}");
    // `Pauses` over a table without one says what to set.
    let err = Pauses::new(&db.pool, &db.table().await, PausesOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pause_table"), "{err}");
}

/// A pause set on the dashboard holds for stores over the table however it
/// was described (columns named with no pause table, `detected`, `typed`):
/// none claims from the paused queue, each claims from the other.
#[tokio::test]
async fn a_pause_from_the_dashboard_holds_for_every_description_of_the_table() {
    let _shared = TIMED.read().await;
    use dbworker::JobTableOptions;
    use dbworker::dashboard::{Dashboard, DashboardOptions};
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap()
        .router();
    let (_, page) = router::get(&app, "/t/jobs/queues").await;
    let token = router::csrf(&page);
    let (status, _, _) = router::post(
        &app,
        "/t/jobs/queues/pause",
        &format!("csrf={token}&queue=mail&do=pause"),
        None,
    )
    .await;
    assert!(status.is_redirection(), "{status}");

    let mut named = JobTableOptions::new("jobs");
    named.queue_column = Some("queue".into());
    let mut typed = JobTableOptions::typed("jobs");
    typed.queue_column = Some("queue".into());
    for options in [named, JobTableOptions::detected("jobs"), typed] {
        let table = JobTable::new(&db.pool, options).await.unwrap();
        let mut o = db.options();
        o.handling = Handling::Heartbeat;
        o.stall.stalled_max_age = Duration::from_secs(60);
        let store = db.store_on(&table, o).await;
        let ids = enqueue(&db, &["mail", "other"]).await;
        assert_eq!(claim(&store).await, vec![ids[1]], "only the other queue");
    }
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE queue = 'mail' AND state = 'queued'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(waiting, 3, "every paused job still waits");
}

/// Through a view, a paused queue's rows stay out of the window of
/// candidates too: filling it (more of them than the window holds, first in
/// the view's order), they left other queues' jobs unclaimed for as long as
/// the pause lasted.
#[tokio::test]
async fn through_a_view_a_paused_queues_backlog_does_not_starve_the_others() {
    let db = set_up().await;
    db.execute("CREATE VIEW jobs_view AS SELECT * FROM jobs")
        .await;
    let mut queues = vec!["a"; 60];
    queues.push("b");
    let ids = enqueue(&db, &queues).await;
    let table = db
        .table_with(|t| {
            t.view_name = Some("jobs_view v".into());
            t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
            t.queue_column = Some("queue".into());
        })
        .await;
    assert!(pauses(&db).await.pause(Some("a"), "ops").await.unwrap());
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    let store = db.store_on(&table, o).await;
    let jobs = store
        .dequeue("host", &DbConditions::new(), 3)
        .await
        .unwrap();
    let claimed: Vec<i64> = jobs.iter().map(|j| j.record().id).collect();
    assert_eq!(claimed, [ids[60]], "queue b's job, past queue a's 60");
}

/// A worker claims ahead while its only handler is busy, then the queue is
/// paused: the buffered jobs go back to the queue, counting nothing, instead
/// of starting. A listening worker is told by the pause's notification; a
/// polling one looks before starting a job that waited a second.
#[tokio::test]
async fn jobs_claimed_ahead_do_not_start_once_their_queue_is_paused() {
    let _shared = TIMED.read().await;
    for (listen, handling) in [
        (true, Handling::Heartbeat),
        (false, Handling::Heartbeat),
        (true, Handling::Transactional),
    ] {
        let case = format!("listen {listen}, {handling:?}");
        let db = set_up().await;
        let ids = enqueue(&db, &["emails"; ahead::JOBS]).await;
        let mut so = db.options();
        so.handling = handling;
        so.stall.stalled_max_age = Duration::from_secs(60);
        if listen {
            so.listen = Listen::TableChannel;
        }
        let store = db.store_on(&pausable_table(&db).await, so).await;
        // Live before the first claim: going live counts as a pause heard
        // (one may have been missed), which would hide the notification's part.
        if listen {
            listening(&store).await;
        }
        let handler = ahead::Gated::default();
        let worker = new_worker(store, handler.clone(), ahead::worker_options("ahead")).unwrap();
        let mut events = worker.subscribe();
        let shutdown = worker.shutdown_handle();
        let run = tokio::spawn(worker.run());
        ahead::claimed_ahead(&db, &case).await;

        assert!(
            pauses(&db)
                .await
                .pause(Some("emails"), "ops")
                .await
                .unwrap()
        );
        tokio::time::sleep(ahead::after_pause(listen)).await;
        ahead::free_the_handler(&db, &handler.0, &case).await;
        shutdown.graceful();
        run.await.unwrap();
        ahead::assert_put_back(&db, &ids, &handler.0, &mut events, &case).await;
    }
}
