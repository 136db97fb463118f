//! Queue gauges on real Postgres: live jobs per state and queue with the oldest
//! age, sampled without scanning finished rows, and exported as gauges that
//! drop to zero when a state empties.

use crate::common;

use std::sync::Arc;

use dbworker::{DbStore, JobTable, QueueStat};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use workerutil::JobState;

use common::{Db, Job};

async fn set_up() -> (Db, Arc<DbStore<Job>>) {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    sqlx::raw_sql(
        "INSERT INTO jobs (state, finished_at) SELECT 'completed', now() FROM generate_series(1, 20000);
         INSERT INTO jobs (state, queue, queued_at) SELECT 'queued', 'emails', now() - interval '60 seconds' FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue) VALUES ('errored', 'emails'), ('queued', 'reports'), ('queued', 'reports'), ('processing', 'reports');
         ANALYZE jobs;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // One connection, so the statistics read below are this connection's.
    // The table is checked on it too, as the store was before.
    let pool = db.db.pool(1).await.unwrap();
    let mut t = Db::table_options();
    t.queue_column = Some("queue".into());
    let table = JobTable::new(&pool, t).await.unwrap();
    let store = Arc::new(DbStore::new(&pool, &table, db.options()).await.unwrap());
    (db, store)
}

async fn seq_scans(store: &DbStore<Job>) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn live_jobs_are_counted_per_state_and_queue_without_scanning_finished_rows() {
    let (_db, store) = set_up().await;
    let before = seq_scans(&store).await;
    let stats = store.queue_stats().await.unwrap();
    assert_eq!(
        seq_scans(&store).await,
        before,
        "no sequential scan of the table"
    );
    // The measurement itself sees a full scan when there is one.
    sqlx::query("SELECT count(*) FROM jobs")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        seq_scans(&store).await > before,
        "the counter must move on a full scan"
    );
    let brief: Vec<(JobState, Option<&str>, u64)> = stats
        .iter()
        .map(|s: &QueueStat| (s.state, s.queue.as_deref(), s.count))
        .collect();
    assert_eq!(
        brief,
        [
            (JobState::Errored, Some("emails"), 1),
            (JobState::Processing, Some("reports"), 1),
            (JobState::Queued, Some("emails"), 3),
            (JobState::Queued, Some("reports"), 2),
        ]
    );
    let oldest = stats[2].oldest_seconds;
    assert!((59.0..120.0).contains(&oldest), "{oldest}");
}

#[test]
fn the_gauges_follow_the_table_and_drop_to_zero() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauges = || {
        let mut out = Vec::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if key.key().name() == dbworker::metrics::QUEUE_DEPTH
                && let DebugValue::Gauge(v) = value
            {
                let labels: Vec<String> =
                    key.key().labels().map(|l| l.value().to_owned()).collect();
                out.push(format!("{}={}", labels.join("/"), v.into_inner()));
            }
        }
        out.sort();
        out
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let (db, store) = set_up().await;
            let mut seen = Vec::new();
            store.record_gauges(&mut seen).await.unwrap();
            assert_eq!(
                gauges(),
                [
                    "jobs/errored/emails=1",
                    "jobs/processing/reports=1",
                    "jobs/queued/emails=3",
                    "jobs/queued/reports=2"
                ]
            );
            sqlx::query("UPDATE jobs SET state = 'completed' WHERE queue = 'reports'")
                .execute(&db.pool)
                .await
                .unwrap();
            store.record_gauges(&mut seen).await.unwrap();
            assert_eq!(
                gauges(),
                [
                    "jobs/errored/emails=1",
                    "jobs/processing/reports=0",
                    "jobs/queued/emails=3",
                    "jobs/queued/reports=0"
                ]
            );
            // Set to 0 once, an empty series is forgotten: a queue per
            // tenant does not grow the series sampled without bound.
            assert_eq!(
                seen,
                [
                    (JobState::Errored, Some("emails".to_owned())),
                    (JobState::Queued, Some("emails".to_owned())),
                ]
            );
            store.record_gauges(&mut seen).await.unwrap();
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert_eq!(
                gauges(),
                [
                    "jobs/errored/emails=1",
                    "jobs/processing/reports=0",
                    "jobs/queued/emails=3",
                    "jobs/queued/reports=0"
                ],
                "the last value set stays 0 until the exporter drops it"
            );
            // A queue that fills again is followed again.
            sqlx::query("UPDATE jobs SET state = 'queued' WHERE queue = 'reports'")
                .execute(&db.pool)
                .await
                .unwrap();
            store.record_gauges(&mut seen).await.unwrap();
            assert_eq!(seen.len(), 3, "{seen:?}");
            assert!(gauges().contains(&"jobs/queued/reports=3".to_owned()));
        });
    });
}

/// The gauges measure a wait from when the job became runnable, as `status`
/// does: a week-old job requeued a minute ago (its `process_after` now) has
/// waited a minute, and a job scheduled ahead has not started waiting.
#[tokio::test]
async fn a_requeued_job_has_waited_since_its_requeue() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (state, queue, queued_at, process_after) VALUES
           ('queued', 'q', now() - interval '7 days', now() - interval '60 seconds'),
           ('queued', 'q', now() - interval '30 days', now() + interval '1 hour')",
    )
    .await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let store = db.store_on(&table, db.options()).await;
    let waited = store.max_age_in_queue().await.unwrap().as_secs_f64();
    assert!((59.0..3600.0).contains(&waited), "{waited}");
    let stats = store.queue_stats().await.unwrap();
    let queued = stats.iter().find(|s| s.state == JobState::Queued).unwrap();
    assert!((59.0..3600.0).contains(&queued.oldest_seconds), "{stats:?}");
}

/// A zero interval, and one past 100 years (the bound on every option's
/// time, `workerutil::duration::MAX`), are refused by name.
#[tokio::test]
async fn the_gauges_service_refuses_a_zero_or_endless_interval() {
    let db = Db::new().await;
    let table = db.table().await;
    let store = std::sync::Arc::new(
        DbStore::<common::Job>::new(&db.pool, &table, Db::options_for_tests())
            .await
            .unwrap(),
    );
    for interval in [std::time::Duration::ZERO, std::time::Duration::MAX] {
        match dbworker::QueueGauges::new(store.clone(), interval) {
            Err(dbworker::Error::InvalidOption {
                field: "interval", ..
            }) => {}
            Err(other) => panic!("{interval:?}: {other}"),
            Ok(_) => panic!("{interval:?}: accepted"),
        }
    }
}

/// Every store operation moves its counter (by outcome) and its histogram;
/// enqueues and resetter passes are counted and timed too.
#[test]
fn store_operations_are_counted_and_timed_by_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // "name{label=value,…}" => count, or samples for a histogram.
    let seen = || {
        let mut out = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let labels: Vec<String> = key
                .key()
                .labels()
                .filter(|l| l.key() != "store" && l.key() != "table")
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.key().name(), labels.join(","));
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => continue,
            };
            out.insert(name, n);
        }
        out
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            use workerutil::Store;
            let db = Db::new().await;
            let table = db.table().await;
            let enqueuer = dbworker::Enqueuer::new(&db.pool, &table).await.unwrap();
            enqueuer.enqueue(dbworker::NewJob::new()).await.unwrap();
            enqueuer
                .enqueue_many([dbworker::NewJob::new(), dbworker::NewJob::new()])
                .await
                .unwrap();
            let mut o = db.options();
            o.max_num_retries = 1;
            o.handling = dbworker::Handling::Heartbeat;
            let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
            let mut jobs = store.dequeue("host", &Default::default(), 3).await.unwrap();
            assert!(
                store
                    .dequeue("host", &Default::default(), 3)
                    .await
                    .unwrap()
                    .is_empty()
            );
            let leases: Vec<_> = jobs.iter().map(workerutil::Job::lease).collect();
            store.heartbeat(&leases).await.unwrap();
            store.mark_complete(&mut jobs[0]).await.unwrap();
            store
                .mark_errored(&mut jobs[1], "once", None)
                .await
                .unwrap();
            assert!(
                !store.mark_complete(&mut jobs[0]).await.unwrap(),
                "not ours twice"
            );
            store.mark_failed(&mut jobs[2], "bad").await.unwrap();
            let resetter = dbworker::Resetter::new(&db.pool, &table, Default::default())
                .await
                .unwrap();
            resetter.reset_once().await.unwrap();
            let seen = seen();
            for (name, n) in [
                ("dbworker_enqueued_total{how=one}", 1),
                ("dbworker_enqueued_total{how=many}", 2),
                ("dbworker_enqueue_seconds{how=many}", 1),
                ("dbworker_claimed_total{}", 3),
                ("dbworker_store_operations_total{op=dequeue,outcome=ok}", 1),
                (
                    "dbworker_store_operations_total{op=dequeue,outcome=empty}",
                    1,
                ),
                ("dbworker_store_operation_seconds{op=dequeue}", 2),
                (
                    "dbworker_store_operations_total{op=heartbeat,outcome=ok}",
                    1,
                ),
                ("dbworker_store_operations_total{op=complete,outcome=ok}", 1),
                (
                    "dbworker_store_operations_total{op=complete,outcome=lost}",
                    1,
                ),
                (
                    "dbworker_store_operations_total{op=errored,outcome=retry}",
                    1,
                ),
                ("dbworker_store_operations_total{op=failed,outcome=ok}", 1),
                ("dbworker_store_operation_seconds{op=complete}", 2),
                ("dbworker_reset_pass_seconds{}", 1),
            ] {
                assert_eq!(seen.get(name), Some(&n), "{name} in {seen:#?}");
            }
        });
    });
}
