//! One `JobTable`, described and checked once, shared in one process by the
//! enqueuer, the store, the admin, the resetter and the dashboard: each uses
//! the renamed column, the optional columns and the error history it was
//! given once. And a description that does not match the database is named at
//! start-up, before any service exists.

use crate::common;
use crate::fixtures::router;

use std::collections::HashMap;

use axum::http::StatusCode;
use dbworker::admin::{Admin, JobFilter, PageRequest};
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::ddl::{OptionalColumns, optional_columns_sql};
use dbworker::{
    DbStore, Enqueuer, Error, Handling, JobTable, JobTableOptions, NewJob, Resetter,
    ResetterOptions,
};
use dbworker::{Enqueued, KeyMode};
use serde_json::json;
use workerutil::{JobState, Store};

use common::{Db, Job};

#[tokio::test]
async fn one_table_value_serves_the_enqueuer_store_admin_resetter_and_dashboard() {
    // `state` is called `status` here: every service must use the name it
    // was given once, in the table's description.
    let renames = HashMap::from([("state".to_owned(), "status".to_owned())]);
    let db = Db::with_renames(&renames).await;
    let mut columns = OptionalColumns::default();
    columns.queue = true;
    columns.keys = true;
    columns.error_history = true;
    db.execute(&optional_columns_sql("jobs", &renames, columns).unwrap())
        .await;

    let mut options = JobTableOptions::detected("jobs j");
    options.alternate_column_names = renames.clone();
    let table = JobTable::new(&db.pool, options).await.unwrap();
    // Detected under their standard names, as `dbworker migration` adds them.
    assert_eq!(table.queue_column(), Some("queue"));
    assert_eq!(table.key_column(), Some("job_key"));
    assert_eq!(table.payload_column(), Some("payload"));

    // The enqueuer writes the queue and the key (deduplicated by the unique
    // index the table's check found).
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let job = |key: &str| {
        NewJob::new()
            .queue("mail")
            .key(key, KeyMode::DedupeOnly)
            .json("payload", json!({ "key": key }))
    };
    let failing = enqueuer.enqueue(&job("a")).await.unwrap().id();
    let stalling = enqueuer.enqueue(&job("b")).await.unwrap().id();
    assert_eq!(
        enqueuer.enqueue(&job("a")).await.unwrap(),
        Enqueued::Kept(failing)
    );

    // The store claims both; one fails (its error history gets the entry),
    // the other is left as a dead worker would leave it.
    let mut store_options = db.options();
    store_options.handling = Handling::Heartbeat;
    let store = DbStore::<Job>::new(&db.pool, &table, store_options.clone())
        .await
        .unwrap();
    let mut claimed = store
        .dequeue("worker-1", &Default::default(), 2)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    claimed.sort_by_key(|j| j.record().id);
    for job in &mut claimed {
        assert!(store.open(job).await.unwrap());
    }
    assert!(
        store
            .mark_failed(&mut claimed[0], "the mail server said no")
            .await
            .unwrap()
    );

    // The resetter, with the store's stall settings, puts the stalled one back.
    db.execute(
        "UPDATE jobs SET last_heartbeat_at = now() - interval '1 hour' WHERE status = 'processing'",
    )
    .await;
    let mut resetter_options = ResetterOptions::new("resetter");
    resetter_options.stall = store_options.stall.clone();
    let resetter = Resetter::new(&db.pool, &table, resetter_options)
        .await
        .unwrap();
    let reset = resetter.reset_once().await.unwrap();
    assert_eq!(
        reset.reset.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [stalling]
    );
    let errors: serde_json::Value = db
        .scalar("SELECT errors FROM jobs WHERE id = $1", stalling)
        .await;
    assert_eq!(
        errors.as_array().map(Vec::len),
        Some(1),
        "the reset appended to the table's history: {errors}"
    );

    // The admin counts and lists by the renamed column and the queue.
    let admin = Admin::new(&db.pool, &table).await.unwrap();
    let status = admin.status().await.unwrap();
    assert_eq!(
        status.live,
        [(JobState::Queued, Some("mail".to_owned()), 1)],
        "{status:?}"
    );
    let mut filter = JobFilter::default();
    filter.states = vec![JobState::Failed];
    filter.queue = Some("mail".into());
    let failed = admin.list(&filter, PageRequest::first(10)).await.unwrap();
    assert_eq!(
        failed.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [failing]
    );

    // The dashboard shows the same table, its queue and the failure's history.
    let dashboard = Dashboard::new(&db.pool, DashboardOptions::new(vec![table.clone()]))
        .await
        .unwrap();
    let app = dashboard.router();
    let (code, page) = router::get(&app, "/t/jobs/queues").await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(page.contains("mail"), "{page}");
    let (code, page) = router::get(&app, &format!("/t/jobs/jobs/{failing}")).await;
    assert_eq!(code, StatusCode::OK, "{page}");
    assert!(page.contains("the mail server said no"), "{page}");
    store.close().await;
}

#[tokio::test]
async fn a_description_the_database_does_not_match_is_named_before_any_service_starts() {
    let db = Db::new().await;
    let mut options = JobTableOptions::new("jobs j");
    options.queue_column = Some("lane".into());
    options.result_column = Some("payload_copy".into());
    let problems = match JobTable::new(&db.pool, options).await {
        Err(Error::Schema { problems }) => problems,
        other => panic!("expected the schema problems, got {other:?}"),
    };
    assert!(
        problems.contains(&"table jobs has no column lane (queue_column)".to_owned()),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("payload_copy (result_column)")),
        "{problems:?}"
    );

    // A key column without its unique index: an enqueue could not deduplicate.
    db.execute("ALTER TABLE jobs ADD COLUMN job_key text").await;
    let mut options = JobTableOptions::new("jobs");
    options.key_column = Some("job_key".into());
    let err = JobTable::new(&db.pool, options).await.unwrap_err();
    assert!(err.to_string().contains("unique index"), "{err}");

    // Pauses on a table described without a pause table are refused by name.
    let table = db.table().await;
    let err = dbworker::control::Pauses::new(&db.pool, &table, Default::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("JobTableOptions::pause_table"),
        "{err}"
    );
}

/// The HOT layout (issue 38, `dbworker::ddl::hot_layout_sql`) needs no
/// setting: `JobTable::new` finds its generated column, claims name it and
/// so read its live index, and each claim is a HOT update (no new index
/// entry). On the standard layout no claim can be: both partial indexes read
/// the state the claim changes.
#[tokio::test]
async fn the_hot_layouts_claims_read_its_index_and_are_hot_updates() {
    // Each way the docs describe a table finds the layout: named columns,
    // or detected ones.
    let detected = || JobTableOptions::detected("jobs");
    for (db, hot, options) in [
        (Db::hot().await, true, Db::table_options()),
        (Db::hot().await, true, detected()),
        (Db::new().await, false, Db::table_options()),
    ] {
        db.enqueue(200, json!({})).await;
        // A pool of its own: its backends report their statistics when they
        // exit, so the counts below are complete once it is closed.
        let pool = sqlx::PgPool::connect(db.db.url()).await.unwrap();
        let table = JobTable::new(&pool, options).await.unwrap();
        let store: DbStore<Job> = DbStore::new(&pool, &table, Db::options_for_tests())
            .await
            .unwrap();
        let mut done = 0;
        while done < 200 {
            let jobs = store
                .dequeue("host", &Default::default(), 50)
                .await
                .unwrap();
            assert!(!jobs.is_empty(), "jobs left: {}", 200 - done);
            for mut job in jobs {
                assert!(store.mark_complete(&mut job).await.unwrap());
                done += 1;
            }
        }
        drop(store);
        pool.close().await;
        let (updates, hot_updates, live_index_scans): (i64, i64, i64) = {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                sqlx::query("SELECT pg_stat_clear_snapshot()")
                    .execute(&db.pool)
                    .await
                    .unwrap();
                let row: (i64, i64, i64) = sqlx::query_as(
                    "SELECT t.n_tup_upd, t.n_tup_hot_upd,
                            COALESCE((SELECT sum(i.idx_scan) FROM pg_stat_user_indexes i WHERE i.indexrelname = 'jobs_live_idx'), 0)::bigint
                     FROM pg_stat_user_tables t WHERE t.relname = 'jobs'",
                )
                .fetch_one(&db.pool)
                .await
                .unwrap();
                if row.0 >= 400 || std::time::Instant::now() > deadline {
                    break row;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        };
        assert_eq!(updates, 400, "a claim and a completion per job");
        if hot {
            assert_eq!(hot_updates, 200, "every claim HOT, no completion");
            assert!(live_index_scans > 0, "claims read the live index");
        } else {
            assert_eq!(hot_updates, 0);
        }
    }
}

/// A column under the layout's name that is not the layout's generated
/// column is named at start-up, rather than trusted by every claim.
#[tokio::test]
async fn a_live_column_that_is_not_the_layouts_is_named_at_start_up() {
    let db = Db::new().await;
    db.execute("ALTER TABLE jobs ADD COLUMN dbworker_live boolean")
        .await;
    let err = JobTable::new(&db.pool, Db::table_options())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("jobs.dbworker_live is not a stored generated column")
            && err.contains("dbworker migration --hot-layout"),
        "{err}"
    );
    // One that forgets the errored jobs would hide their retries.
    db.execute(
        "ALTER TABLE jobs DROP COLUMN dbworker_live;
         ALTER TABLE jobs ADD COLUMN dbworker_live boolean GENERATED ALWAYS AS (state IN ('queued', 'processing')) STORED",
    )
    .await;
    let err = JobTable::new(&db.pool, Db::table_options())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not whether the job is queued, errored or processing"),
        "{err}"
    );
}
