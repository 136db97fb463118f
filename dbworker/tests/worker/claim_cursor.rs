//! The claim cursor on real Postgres: claims start past what they took, yet
//! never skip an eligible row for longer than the probe interval (rows
//! scheduled, reset by another process, or committed late behind it), and
//! under a transaction that pins the xmin every eligible job is still claimed.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use dbworker::DbStore;
use dbworker::{Resetter, ResetterOptions};
use serde_json::json;
use sqlx::Connection;
use tokio::time::Instant;
use workerutil::Store;

use common::Db;

const PROBE_EVERY: Duration = Duration::from_millis(300);

async fn cursor_store(db: &Db) -> DbStore<common::Job> {
    let mut o = db.options();
    o.claim.claim_cursor = Some(PROBE_EVERY);
    o.max_num_retries = 3;
    DbStore::new(&db.pool, &db.table().await, o).await.unwrap()
}

/// Claims `limit` at a time (completing each job) until `want` is claimed or
/// `deadline` passes; returns the claimed ids.
async fn claim_until(
    store: &DbStore<common::Job>,
    want: &[i64],
    deadline: Duration,
) -> BTreeSet<i64> {
    let until = Instant::now() + deadline;
    let mut claimed = BTreeSet::new();
    while !want.iter().all(|id| claimed.contains(id)) && Instant::now() < until {
        let jobs = store.dequeue("host", &Default::default(), 5).await.unwrap();
        for mut job in jobs {
            claimed.insert(job.record().id);
            assert!(store.mark_complete(&mut job).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    claimed
}

#[tokio::test]
async fn rows_that_become_eligible_behind_the_cursor_are_claimed_after_the_next_probe() {
    // On both layouts: the HOT layout's claims, probe and resetter read its
    // live index instead of the two partial indexes.
    for db in [Db::new().await, Db::hot().await] {
        eligible_behind_the_cursor(db).await;
    }
}

async fn eligible_behind_the_cursor(db: Db) {
    let store = cursor_store(&db).await;
    let ids = db.enqueue(20, json!({})).await;
    // A job scheduled a little later, among the first ones.
    sqlx::query(
        "UPDATE jobs SET process_after = now() + interval '400 milliseconds' WHERE id = $1",
    )
    .bind(ids[2])
    .execute(&db.pool)
    .await
    .unwrap();
    // A job another process claimed and lost (its resetter puts it back).
    sqlx::query("UPDATE jobs SET state = 'processing', started_at = now(), last_heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(ids[4])
        .execute(&db.pool)
        .await
        .unwrap();
    // A job whose insert commits after the claims passed its id.
    let mut late = sqlx::PgConnection::connect(db.db.url()).await.unwrap();
    let mut tx = late.begin().await.unwrap();
    let late_id: i64 = sqlx::query_scalar("INSERT INTO jobs (payload) VALUES ('{}') RETURNING id")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let after: Vec<i64> = db.enqueue(5, json!({})).await;
    assert!(late_id < after[0]);

    let mut all: Vec<i64> = ids.iter().chain(&after).copied().collect();
    all.retain(|id| ![ids[2], ids[4]].contains(id));
    let first = claim_until(&store, &all, Duration::from_secs(10)).await;
    assert!(
        all.iter().all(|id| first.contains(id)),
        "every eligible job"
    );
    // The cursor is now past every id.
    tx.commit().await.unwrap();
    let mut ro = ResetterOptions::new("other process");
    ro.stall.stalled_max_age = Duration::from_secs(5);
    let resetter = Resetter::new(&db.pool, &db.table().await, ro)
        .await
        .unwrap();
    let reset = resetter.reset_once().await.unwrap();
    assert_eq!(
        reset.reset.iter().map(|r| r.0).collect::<Vec<_>>(),
        [ids[4]]
    );

    let behind = [ids[2], ids[4], late_id];
    let started = Instant::now();
    let second = claim_until(&store, &behind, Duration::from_secs(10)).await;
    assert!(
        behind.iter().all(|id| second.contains(id)),
        "claimed behind the cursor: {second:?}, wanted {behind:?}"
    );
    // Generous: one probe, plus the schedule, plus a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(db.count("completed").await, 26, "20 + 5 + the late one");
}

#[tokio::test]
async fn claims_under_a_pinned_xmin_return_every_eligible_job() {
    // On both layouts: the HOT layout's claims, probe and resetter read its
    // live index instead of the two partial indexes.
    for db in [Db::new().await, Db::hot().await] {
        under_a_pinned_xmin(db).await;
    }
}

async fn under_a_pinned_xmin(db: Db) {
    let store = cursor_store(&db).await;
    // Another session's snapshot, held while every job below is claimed: no
    // dead index entry behind it can be removed.
    let mut pin = sqlx::PgConnection::connect(db.db.url()).await.unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut pin)
        .await
        .unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&mut pin)
        .await
        .unwrap();
    let ids = db.enqueue(500, json!({})).await;
    // Every tenth job errors once (retried at once) and must come back.
    let mut failed_once = BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(30);
    let mut done = BTreeSet::new();
    while done.len() < ids.len() && Instant::now() < until {
        for mut job in store
            .dequeue("host", &Default::default(), 16)
            .await
            .unwrap()
        {
            let id = job.record().id;
            if id % 10 == 0 && failed_once.insert(id) {
                assert!(
                    store
                        .mark_errored(&mut job, "once", None)
                        .await
                        .unwrap()
                        .is_some()
                );
            } else {
                assert!(store.mark_complete(&mut job).await.unwrap());
                done.insert(id);
            }
        }
    }
    assert_eq!(done.len(), ids.len(), "every job, while the xmin is pinned");
    assert_eq!(db.count("completed").await, 500);
    sqlx::query("COMMIT").execute(&mut pin).await.unwrap();
}

/// With LISTEN on, a row another process puts back behind the cursor (a reset,
/// a workflow's release, an operator's requeue) announces its id, and the
/// cursor goes back for it at once: the probe here looks only once an hour.
#[tokio::test]
async fn a_requeue_announced_by_notify_takes_the_cursor_back_at_once() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::notify_trigger_sql("jobs", &Default::default(), None).unwrap())
        .await;
    let mut o = db.options();
    o.claim.claim_cursor = Some(Duration::from_secs(3600));
    o.listen = dbworker::Listen::TableChannel;
    let store = DbStore::new(&db.pool, &db.table().await, o).await.unwrap();
    let ids = db.enqueue(20, json!({})).await;
    // Another process holds one of the first jobs.
    sqlx::query("UPDATE jobs SET state = 'processing', started_at = now() WHERE id = $1")
        .bind(ids[3])
        .execute(&db.pool)
        .await
        .unwrap();
    let others: Vec<i64> = ids.iter().copied().filter(|id| *id != ids[3]).collect();
    let first = claim_until(&store, &others, Duration::from_secs(10)).await;
    assert!(others.iter().all(|id| first.contains(id)));
    // The cursor is past every id; the other process gives the job back.
    sqlx::query("UPDATE jobs SET state = 'queued', worker_hostname = '' WHERE id = $1")
        .bind(ids[3])
        .execute(&db.pool)
        .await
        .unwrap();
    let started = Instant::now();
    let second = claim_until(&store, &[ids[3]], Duration::from_secs(5)).await;
    assert!(
        second.contains(&ids[3]),
        "the requeued job behind the cursor was not claimed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A listening store with the NOTIFY trigger, whose probe looks only every
/// `probe` (long: a prompt claim behind the cursor is then the notification's
/// doing).
async fn listening_store(db: &Db, probe: Duration) -> DbStore<common::Job> {
    db.execute(&dbworker::ddl::notify_trigger_sql("jobs", &Default::default(), None).unwrap())
        .await;
    let mut o = db.options();
    o.claim.claim_cursor = Some(probe);
    o.listen = dbworker::Listen::TableChannel;
    let store = DbStore::new(&db.pool, &db.table().await, o).await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !store.wakeups().is_some_and(|w| w.is_live()) {
        assert!(Instant::now() < until, "the listener never went live");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store
}

/// Issue 25 §1b: with concurrent producers, a transaction that took its id
/// may commit after another's higher id was claimed and the cursor moved past
/// it. The insert's notification carries its lowest id and takes the cursor
/// back, so the job is claimed at once rather than at the probe's next look
/// (30 s here).
#[tokio::test]
async fn an_insert_that_commits_behind_the_cursor_is_claimed_at_once() {
    let db = Db::new().await;
    let store = listening_store(&db, Duration::from_secs(30)).await;
    // One producer takes its id, then is slow to commit.
    let mut slow = sqlx::PgConnection::connect(db.db.url()).await.unwrap();
    let mut tx = slow.begin().await.unwrap();
    let late: i64 = sqlx::query_scalar("INSERT INTO jobs (payload) VALUES ('{}') RETURNING id")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // Another producer's higher ids commit and are claimed: the cursor passes `late`.
    let after = db.enqueue(3, json!({})).await;
    assert!(late < after[0]);
    let first = claim_until(&store, &after, Duration::from_secs(10)).await;
    assert!(after.iter().all(|id| first.contains(id)), "{first:?}");
    assert!(!first.contains(&late), "not committed yet");

    tx.commit().await.unwrap();
    let started = Instant::now();
    let second = claim_until(&store, &[late], Duration::from_secs(10)).await;
    assert!(
        second.contains(&late),
        "the job that committed behind the cursor was not claimed within 10 s (the probe looks every 30 s)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    store.close().await;
}

/// The insert trigger notifies once per statement, however many rows it
/// inserts, with the lowest id; a statement that inserts nothing is silent.
/// On a partitioned table too (its transition table spans the partitions).
#[tokio::test]
async fn each_insert_statement_announces_its_lowest_id_once() {
    for db in [Db::new().await, Db::partitioned().await] {
        db.execute(&dbworker::ddl::notify_trigger_sql("jobs", &Default::default(), None).unwrap())
            .await;
        let mut listener = sqlx::postgres::PgListener::connect(db.db.url())
            .await
            .unwrap();
        listener.listen("dbworker_jobs").await.unwrap();
        let bulk = db.enqueue(500, json!({})).await;
        sqlx::query("INSERT INTO jobs (payload) SELECT '{}' WHERE false")
            .execute(&db.pool)
            .await
            .unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        let mut one_by_one = Vec::new();
        for _ in 0..2 {
            let id: i64 =
                sqlx::query_scalar("INSERT INTO jobs (payload) VALUES ('{}') RETURNING id")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            one_by_one.push(id);
        }
        tx.commit().await.unwrap();
        let mut payloads = Vec::new();
        while let Ok(received) =
            tokio::time::timeout(Duration::from_millis(500), listener.try_recv()).await
        {
            payloads.push(received.unwrap().unwrap().payload().to_owned());
        }
        let want: Vec<String> = [bulk[0], one_by_one[0], one_by_one[1]]
            .iter()
            .map(i64::to_string)
            .collect();
        assert_eq!(payloads, want);
    }
}

/// When the probe finds no idle connection to look with, it sends the
/// claims back to the start and wakes the workers, so one claims soon: an
/// idle worker that hears nothing else would wait for its poll (or its
/// backed-off wait), and a job coming due behind the cursor with it.
#[tokio::test]
async fn a_probe_without_an_idle_connection_wakes_the_workers() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::notify_trigger_sql("jobs", &Default::default(), None).unwrap())
        .await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(db.db.url())
        .await
        .unwrap();
    let mut o = db.options();
    o.claim.claim_cursor = Some(PROBE_EVERY);
    o.listen = dbworker::Listen::TableChannel;
    let store: DbStore<common::Job> = DbStore::new(&pool, &db.table().await, o).await.unwrap();
    let mut wakeups = store.wakeups().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !wakeups.is_live() {
        assert!(Instant::now() < until, "the listener never went live");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Claims move the cursor past every job.
    let ids = db.enqueue(5, json!({})).await;
    let claimed = claim_until(&store, &ids, Duration::from_secs(10)).await;
    assert_eq!(claimed.len(), ids.len());
    // Handlers (say) hold every connection of the pool. Marked seen first,
    // so a probe's wake-up while they are taken counts.
    wakeups.mark_seen();
    let held = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    let woken = tokio::time::timeout(PROBE_EVERY * 5, wakeups.woken()).await;
    assert!(woken.is_ok(), "no wake-up from a probe that could not look");
    drop(held);
}

/// The probe wakes the workers for a job that came due since its last look,
/// not for an older eligible row the claims leave (here one locked by another
/// transaction; a limit that binds does the same), which would wake them at
/// every look and undo an idle worker's back-off.
#[tokio::test]
async fn the_probe_wakes_the_workers_for_a_job_coming_due_not_for_a_row_the_claims_leave() {
    let db = Db::new().await;
    let store = listening_store(&db, PROBE_EVERY).await;
    let mut wakeups = store.wakeups().unwrap();
    wakeups.mark_seen();
    // A row that came due 5 s ago, and one scheduled for tomorrow, in one
    // statement.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobs (payload, process_after) VALUES ('{}', now() - interval '5 seconds'), ('{}', now() + interval '1 day') RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let (held, due) = (ids[0], ids[1]);
    let notified = tokio::time::timeout(Duration::from_secs(10), wakeups.woken()).await;
    assert!(notified.is_ok(), "no wake-up from the insert");
    let mut other = sqlx::PgConnection::connect(db.db.url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *tx)
        .await
        .unwrap();
    // The claim leaves the locked row, and registers its conditions.
    let none = store.dequeue("host", &Default::default(), 5).await.unwrap();
    assert!(none.is_empty(), "the locked row is left");
    // It came due within the first look's reach: that look wakes them (the
    // next may too); no later one does.
    let mut wakes = 0;
    let until = Instant::now() + PROBE_EVERY * 12;
    while Instant::now() < until {
        wakeups.mark_seen();
        if tokio::time::timeout(PROBE_EVERY * 2, wakeups.woken())
            .await
            .is_ok()
        {
            wakes += 1;
        }
    }
    assert!(wakes <= 2, "woken {wakes} times for a row the claims leave");
    // The other job comes due a second from now (no notification: its
    // state does not change), and wakes them once it is due.
    let scheduled = std::time::Instant::now();
    sqlx::query("UPDATE jobs SET process_after = now() + interval '1 second' WHERE id = $1")
        .bind(due)
        .execute(&db.pool)
        .await
        .unwrap();
    common::woken_once_due(&mut wakeups, scheduled, Duration::from_secs(6)).await;
    let claimed = claim_until(&store, &[due], Duration::from_secs(5)).await;
    assert!(claimed.contains(&due) && !claimed.contains(&held));
    tx.rollback().await.unwrap();
    store.close().await;
}
