//! The admin API's complete, reschedule and remove-by-key on real Postgres:
//! on ids and on a filter, never touching a job a worker holds.

use crate::common;

use std::time::Duration;

use dbworker::{
    Error, JobTable,
    admin::{Admin, BulkAction, Canceled, JobFilter, Removed, Reschedule},
    ddl::OptionalColumns,
};
use workerutil::JobState;

use common::Db;

async fn set_up() -> (Db, Admin) {
    let db = Db::new().await;
    db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
    let table = db
        .table_with(|t| {
            t.key_column = Some("job_key".into());
            t.priority_column = Some("priority".into());
            t.max_retries_column = Some("max_retries".into());
            t.queue_column = Some("queue".into());
        })
        .await;
    let admin = Admin::new(&db.pool, &table).await.unwrap();
    (db, admin)
}

/// A job in `state` with two failures, keyed `key-<state>`, in queue `queue`.
async fn job(db: &Db, state: &str, queue: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (state, num_failures, job_key, queue) VALUES ($1, 2, 'key-' || $1 || '-' || $2, $2) RETURNING id",
    )
    .bind(state)
    .bind(queue)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn complete_acts_on_ids_and_filters_but_never_on_a_processing_job() {
    let (db, admin) = set_up().await;
    let queued = job(&db, "queued", "a").await;
    let failed = job(&db, "failed", "a").await;
    let processing = job(&db, "processing", "a").await;
    let done = admin
        .act_on_ids(&[queued, failed, processing], &BulkAction::Complete)
        .await
        .unwrap();
    assert_eq!(done, 2);
    assert_eq!(db.state(queued).await, "completed");
    assert_eq!(db.state(failed).await, "completed");
    assert_eq!(db.state(processing).await, "processing");

    // On a filter: only queue b's errored jobs.
    let errored = job(&db, "errored", "b").await;
    let other = job(&db, "errored", "c").await;
    let busy = job(&db, "processing", "b").await;
    let mut filter = JobFilter::default();
    filter.queue = Some("b".into());
    assert_eq!(
        admin
            .count_matching(&filter, &BulkAction::Complete)
            .await
            .unwrap(),
        1
    );
    let n = admin
        .act_on_matching(&filter, &BulkAction::Complete, 1, |_| {})
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(db.state(errored).await, "completed");
    assert_eq!(db.state(other).await, "errored");
    assert_eq!(db.state(busy).await, "processing");
}

#[tokio::test]
async fn reschedule_sets_only_what_it_is_given() {
    let (db, admin) = set_up().await;
    let failed = job(&db, "failed", "a").await;
    let processing = job(&db, "processing", "a").await;
    let mut r = Reschedule::default();
    r.run_after = Some(Duration::from_secs(600));
    r.priority = Some(4);
    r.num_failures = Some(0);
    let n = admin
        .act_on_ids(&[failed, processing], &BulkAction::Reschedule(r))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let read = |id| {
        sqlx::query_as::<_, (String, i32, i32, Option<i32>, Option<f64>)>(
            "SELECT state, num_failures, priority, max_retries,
                    EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
    };
    let (state, failures, priority, limit, delay) = read(failed).await.unwrap();
    assert_eq!(
        (state.as_str(), failures, priority, limit),
        ("queued", 0, 4, None)
    );
    assert!(delay.unwrap() > 590.0, "{delay:?}");
    let (state, failures, priority, _, delay) = read(processing).await.unwrap();
    assert_eq!(
        (state.as_str(), failures, priority, delay),
        ("processing", 2, 0, None)
    );

    // Only the retry limit: run-at and priority stay.
    let mut r = Reschedule::default();
    r.max_retries = Some(7);
    let mut filter = JobFilter::default();
    filter.states = vec![JobState::Queued];
    let n = admin
        .act_on_matching(&filter, &BulkAction::Reschedule(r), 10, |_| {})
        .await
        .unwrap();
    assert_eq!(n, 1);
    let (_, _, priority, limit, delay) = read(failed).await.unwrap();
    assert_eq!((priority, limit), (4, Some(7)));
    assert!(delay.unwrap() > 590.0);

    // Both run-ats, or a field whose column the admin does not know, are refused.
    let mut both = Reschedule::default();
    both.run_at = Some(std::time::SystemTime::now());
    both.run_after = Some(Duration::ZERO);
    let err = admin
        .act_on_ids(&[failed], &BulkAction::Reschedule(both))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                field: "run_at",
                ..
            }
        ),
        "{err}"
    );
    let plain = Admin::new(&db.pool, &db.table().await).await.unwrap();
    let mut r = Reschedule::default();
    r.priority = Some(1);
    let err = plain
        .act_on_ids(&[failed], &BulkAction::Reschedule(r))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("priority_column"), "{err}");
}

#[tokio::test]
async fn remove_key_deletes_a_waiting_holder_and_ends_a_processing_ones_retries() {
    let (db, admin) = set_up().await;
    let queued = job(&db, "queued", "a").await;
    let processing = job(&db, "processing", "a").await;
    assert_eq!(
        admin.remove_key("key-queued-a").await.unwrap(),
        Removed::Deleted(queued)
    );
    let left: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", queued)
        .await;
    assert_eq!(left, 0);
    assert_eq!(
        admin.remove_key("key-processing-a").await.unwrap(),
        Removed::Processing(processing)
    );
    // It runs on, but gives up its key, and an error will not be retried:
    // its limit is its failures so far (graphile-worker's remove_job).
    assert_eq!(db.state(processing).await, "processing");
    let (key, limit): (Option<String>, Option<i32>) =
        sqlx::query_as("SELECT job_key, max_retries FROM jobs WHERE id = $1")
            .bind(processing)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((key, limit), (None, Some(2)), "its two failures so far");
    assert_eq!(
        admin.remove_key("no-such-key").await.unwrap(),
        Removed::NotFound
    );

    // The configured columns are checked at start-up.
    let bare = Db::new().await;
    let mut o = Db::table_options();
    o.key_column = Some("job_key".into());
    let err = JobTable::new(&bare.pool, o).await.unwrap_err();
    assert!(err.to_string().contains("job_key"), "{err}");
}

/// A requeued job has not run in its new life: its old start goes, so one
/// canceled before its next claim records no run of days.
#[tokio::test]
async fn a_requeue_forgets_the_old_attempts_start() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, started_at, finished_at) VALUES ('failed', now() - interval '7 days', now() - interval '7 days')",
    )
    .await;
    let id: i64 = db.scalar("SELECT max(id) FROM jobs WHERE $1 = $1", 0).await;
    let admin = dbworker::admin::Admin::new(&db.pool, &db.table().await)
        .await
        .unwrap();
    assert!(admin.requeue(id).await.unwrap());
    admin.cancel(id).await.unwrap();
    let (state, started): (String, Option<String>) =
        sqlx::query_as("SELECT state, started_at::text FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), started), ("canceled", None));
}

/// Complete, fail and cancel stamp `finished_at` with the time they wrote
/// the row, also after waiting for a transaction writing it (a heartbeat,
/// an application's update): in bulk and one job at a time, all waiting at
/// once. Before, `now()`: the statement's start, 1.5 s early here.
#[tokio::test]
async fn finishing_actions_that_waited_for_a_rows_lock_stamp_the_time_they_wrote_it() {
    let (db, admin) = set_up().await;
    let bulk = [
        ("Complete", BulkAction::Complete),
        ("Fail", BulkAction::Fail("by hand".into())),
        ("Cancel", BulkAction::Cancel),
    ];
    let mut ids = Vec::new();
    for (name, _) in &bulk {
        ids.push((job(&db, "queued", name).await, *name));
    }
    let (fail, cancel) = (
        job(&db, "errored", "one").await,
        job(&db, "queued", "one").await,
    );
    ids.extend([(fail, "Admin::fail"), (cancel, "Admin::cancel")]);
    let acting = {
        let (admin, on) = (admin.clone(), ids.clone());
        async move {
            let bulk = bulk
                .iter()
                .zip(&on)
                .map(|((_, action), (id, _))| admin.act_on_ids(std::slice::from_ref(id), action));
            let (done, failed, canceled) = tokio::join!(
                futures_util::future::join_all(bulk),
                admin.fail(fail, "by hand"),
                admin.cancel(cancel),
            );
            let done: u64 = done.into_iter().map(Result::unwrap).sum();
            (done, failed.unwrap(), canceled.unwrap())
        }
    };
    let locked: Vec<i64> = ids.iter().map(|(id, _)| *id).collect();
    let ((done, failed, canceled), released) = db.after_row_locks(&locked, acting).await;
    assert_eq!((done, failed), (3, true));
    assert_eq!(canceled, Canceled::Now);
    let mut early = Vec::new();
    for (id, what) in ids {
        let finished = db.finished_at(id).await;
        if finished < released {
            early.push(format!("{what} {:.2} s early", released - finished));
        }
    }
    assert_eq!(early, Vec::<String>::new(), "finished before the write");
}
