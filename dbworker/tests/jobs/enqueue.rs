//! The enqueue side on real Postgres: one job, many, inside a transaction,
//! run-at by the database clock, priority and queue, job keys in every mode
//! (and under eight concurrent enqueuers), and the start-up check.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dbworker::{
    DbConditions, Enqueued, Enqueuer, Error, Handling, JobTable, JobTableOptions, KeyMode, NewJob,
    ddl::{OptionalColumns, enqueue_function_sql, partitioned_keys_sql},
};
use serde_json::json;
use tokio::sync::Barrier;
use workerutil::Store;

use common::{Db, Job};

/// The test table with every optional column, and an enqueuer that uses them.
async fn set_up() -> (Db, Enqueuer) {
    set_up_on(Table::Plain).await
}

/// A plain job table, or one partitioned by day (its keys in a key table).
#[derive(Debug, Clone, Copy)]
enum Table {
    Plain,
    Partitioned,
}

async fn set_up_on(table: Table) -> (Db, Enqueuer) {
    let db = match table {
        Table::Plain => {
            let db = Db::new().await;
            db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
            db
        }
        Table::Partitioned => {
            let db = Db::partitioned().await;
            let keys = partitioned_keys_sql("jobs", &Default::default()).unwrap();
            db.add_columns(
                |c| {
                    *c = OptionalColumns::all();
                    c.keys = false;
                },
                &[keys],
            )
            .await;
            db
        }
    };
    let table = JobTable::new(&db.pool, full_options()).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    (db, enqueuer)
}

fn full_options() -> JobTableOptions {
    let mut o = Db::table_options();
    o.key_column = Some("job_key".into());
    o.queue_column = Some("queue".into());
    o.priority_column = Some("priority".into());
    o.max_retries_column = Some("max_retries".into());
    o
}

async fn payload(db: &Db, id: i64) -> serde_json::Value {
    db.scalar("SELECT payload FROM jobs WHERE id = $1", id)
        .await
}

/// Seconds from the database's `now()` until the job's `process_after`.
async fn delay_of(db: &Db, id: i64) -> Option<f64> {
    db.scalar(
        "SELECT EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1",
        id,
    )
    .await
}

#[tokio::test]
async fn jobs_are_inserted_one_or_many_on_the_pool_or_in_the_callers_transaction() {
    let (db, enqueuer) = set_up().await;

    let one = enqueuer
        .enqueue(&NewJob::new().json("payload", json!({"n": 1})))
        .await
        .unwrap();
    assert!(matches!(one, Enqueued::Inserted(_)), "{one:?}");
    assert_eq!(payload(&db, one.id()).await, json!({"n": 1}));
    assert_eq!(db.state(one.id()).await, "queued");

    // Inside a transaction: gone with its rollback, there with its commit.
    let mut tx = db.pool.begin().await.unwrap();
    let rolled_back = enqueuer
        .enqueue_in(&mut tx, &NewJob::new().json("payload", json!({"n": 2})))
        .await
        .unwrap()
        .id();
    tx.rollback().await.unwrap();
    let count: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", rolled_back)
        .await;
    assert_eq!(count, 0);
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueuer
        .enqueue_many_in(
            &mut tx,
            &[
                NewJob::new().json("payload", json!({"n": 3})),
                NewJob::new().set("cost", 7).priority(5).queue("reports"),
                NewJob::new(),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "in input order: {ids:?}"
    );
    assert_eq!(payload(&db, ids[0]).await, json!({"n": 3}));
    let (cost, priority, queue): (i32, i32, String) =
        sqlx::query_as("SELECT cost, priority, queue FROM jobs WHERE id = $1")
            .bind(ids[1])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((cost, priority, queue.as_str()), (7, 5, "reports"));
    // Columns a job does not set take their defaults.
    assert_eq!(payload(&db, ids[2]).await, json!({}));
    let queue: String = db
        .scalar("SELECT queue FROM jobs WHERE id = $1", ids[2])
        .await;
    assert_eq!(queue, "default");
}

#[tokio::test]
async fn run_at_is_by_the_database_clock_and_priority_orders_the_claim() {
    let (db, enqueuer) = set_up().await;
    let later = enqueuer
        .enqueue(&NewJob::new().run_after(Duration::from_secs(3600)))
        .await
        .unwrap()
        .id();
    let delay = delay_of(&db, later).await.unwrap();
    assert!((3590.0..=3600.0).contains(&delay), "{delay}");
    let past = enqueuer
        .enqueue(&NewJob::new().run_at(SystemTime::now() - Duration::from_secs(60)))
        .await
        .unwrap()
        .id();
    let low = enqueuer
        .enqueue(&NewJob::new().priority(1))
        .await
        .unwrap()
        .id();
    let high = enqueuer
        .enqueue(&NewJob::new().priority(9))
        .await
        .unwrap()
        .id();

    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    let table = db
        .table_with(|t| t.order_by = Some("j.priority DESC, j.id".into()))
        .await;
    let store = dbworker::DbStore::<Job>::new(&db.pool, &table, o)
        .await
        .unwrap();
    let jobs = store
        .dequeue("host", &DbConditions::new(), 10)
        .await
        .unwrap();
    let claimed: Vec<i64> = jobs.iter().map(|j| j.record().id).collect();
    // The delayed job waits; the rest come by priority, then id.
    assert_eq!(claimed, [high, low, past]);
}

#[tokio::test]
async fn keys_replace_or_keep_a_waiting_job_and_a_processing_one_gives_its_key_up() {
    keys_replace_or_keep_a_waiting_job_and_a_processing_one_gives_its_key_up_on(Table::Plain).await;
}

#[tokio::test]
async fn on_a_partitioned_table_keys_replace_or_keep_a_waiting_job_and_a_processing_one_gives_its_key_up()
 {
    keys_replace_or_keep_a_waiting_job_and_a_processing_one_gives_its_key_up_on(Table::Partitioned)
        .await;
}

async fn keys_replace_or_keep_a_waiting_job_and_a_processing_one_gives_its_key_up_on(table: Table) {
    let (db, enqueuer) = set_up_on(table).await;
    let keyed = |n: i64, mode: KeyMode| {
        NewJob::new()
            .json("payload", json!({ "n": n }))
            .run_after(Duration::from_secs(60 * n.unsigned_abs()))
            .key("user:42", mode)
    };
    let first = enqueuer.enqueue(&keyed(1, KeyMode::Replace)).await.unwrap();
    assert!(matches!(first, Enqueued::Inserted(_)), "{first:?}");
    let id = first.id();

    // Replace: the waiting job takes the new payload and run-at.
    let replaced = enqueuer
        .enqueue(&keyed(10, KeyMode::Replace))
        .await
        .unwrap();
    assert_eq!(replaced, Enqueued::Updated(id));
    assert_eq!(payload(&db, id).await, json!({"n": 10}));
    assert!(delay_of(&db, id).await.unwrap() > 590.0);

    // PreserveRunAt: the payload, not the run-at.
    let preserved = enqueuer
        .enqueue(&keyed(2, KeyMode::PreserveRunAt))
        .await
        .unwrap();
    assert_eq!(preserved, Enqueued::Updated(id));
    assert_eq!(payload(&db, id).await, json!({"n": 2}));
    assert!(delay_of(&db, id).await.unwrap() > 590.0, "run-at kept");

    // PreserveRunAt on a holder that failed before (graphile-worker's rule):
    // its run-at was a retry's, so it takes the new one, and starts over.
    sqlx::query("UPDATE jobs SET state = 'errored', num_failures = 1, failure_message = 'boom', process_after = now() + interval '1 day' WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let retaken = enqueuer
        .enqueue(&keyed(2, KeyMode::PreserveRunAt))
        .await
        .unwrap();
    assert_eq!(retaken, Enqueued::Updated(id));
    let delay = delay_of(&db, id).await.unwrap();
    assert!(
        (100.0..130.0).contains(&delay),
        "the new run-at (2 min), not the retry's: {delay}"
    );
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!((db.state(id).await.as_str(), failures), ("queued", 0));

    // DedupeOnly: nothing changes.
    let kept = enqueuer
        .enqueue(&keyed(3, KeyMode::DedupeOnly))
        .await
        .unwrap();
    assert_eq!(kept, Enqueued::Kept(id));
    assert_eq!(payload(&db, id).await, json!({"n": 2}));
    let holders: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE job_key = (SELECT job_key FROM jobs WHERE id = $1)",
            id,
        )
        .await;
    assert_eq!(holders, 1, "one job holds the key");

    // Once it is processing, its columns never change. The dedupe modes keep
    // it; a replacing mode takes the key from it for a new job.
    sqlx::query("UPDATE jobs SET process_after = NULL WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let store = db.store(Handling::Heartbeat).await;
    let mut jobs = store
        .dequeue("host", &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!(jobs[0].record().id, id);
    for mode in [KeyMode::DedupeOnly, KeyMode::UnsafeDedupe] {
        let got = enqueuer.enqueue(&keyed(4, mode)).await.unwrap();
        assert_eq!(got, Enqueued::Kept(id), "{mode:?}");
    }
    let replaced = enqueuer.enqueue(&keyed(5, KeyMode::Replace)).await.unwrap();
    let new = match replaced {
        Enqueued::Inserted(new) if new != id => new,
        other => panic!("a processing holder gives its key to a new job: {other:?}"),
    };
    assert_eq!(payload(&db, new).await, json!({"n": 5}));
    assert_eq!(
        payload(&db, id).await,
        json!({"n": 2}),
        "the running job's columns are untouched"
    );
    assert_eq!(db.state(id).await, "processing");
    let (old_key, old_limit): (Option<String>, Option<i32>) =
        sqlx::query_as("SELECT job_key, max_retries FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(old_key, None, "the running job gave up its key");
    assert_eq!(
        old_limit,
        Some(0),
        "and will not be retried: the new job carries the work"
    );
    // The running attempt's fence is intact: its mark still lands.
    assert!(store.mark_complete(&mut jobs[0]).await.unwrap());
    assert_eq!(db.state(id).await, "completed");
    // The new job is a waiting holder: the next replace updates it.
    let again = enqueuer
        .enqueue(&keyed(6, KeyMode::PreserveRunAt))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Updated(new));

    // A failed job frees its key, except for UnsafeDedupe.
    sqlx::query("UPDATE jobs SET state = 'failed' WHERE id = $1")
        .bind(new)
        .execute(&db.pool)
        .await
        .unwrap();
    let unsafe_kept = enqueuer
        .enqueue(&keyed(7, KeyMode::UnsafeDedupe))
        .await
        .unwrap();
    assert_eq!(unsafe_kept, Enqueued::Kept(new));
    let next = enqueuer
        .enqueue(&keyed(8, KeyMode::DedupeOnly))
        .await
        .unwrap();
    assert!(
        matches!(next, Enqueued::Inserted(other) if other != new),
        "{next:?}"
    );
    // With no holder at all, UnsafeDedupe inserts.
    let first = enqueuer
        .enqueue(&NewJob::new().key("fresh", KeyMode::UnsafeDedupe))
        .await
        .unwrap();
    assert!(matches!(first, Enqueued::Inserted(_)), "{first:?}");
}

#[tokio::test]
async fn replacing_an_errored_holder_starts_it_over() {
    replacing_an_errored_holder_starts_it_over_on(Table::Plain).await;
}

#[tokio::test]
async fn on_a_partitioned_table_replacing_an_errored_holder_starts_it_over() {
    replacing_an_errored_holder_starts_it_over_on(Table::Partitioned).await;
}

async fn replacing_an_errored_holder_starts_it_over_on(table: Table) {
    let (db, enqueuer) = set_up_on(table).await;
    let job = |n: i64, mode| {
        NewJob::new()
            .json("payload", json!({ "n": n }))
            .key("k", mode)
    };
    let id = enqueuer
        .enqueue(&job(1, KeyMode::Replace))
        .await
        .unwrap()
        .id();
    sqlx::query(
        "UPDATE jobs SET state = 'errored', num_failures = 3, failure_message = 'boom', finished_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    for mode in [KeyMode::Replace, KeyMode::PreserveRunAt] {
        let got = enqueuer.enqueue(&job(2, mode)).await.unwrap();
        assert_eq!(got, Enqueued::Updated(id), "{mode:?}");
        let (state, failures, message): (String, i32, Option<String>) =
            sqlx::query_as("SELECT state, num_failures, failure_message FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            (state.as_str(), failures, message),
            ("queued", 0, None),
            "{mode:?}"
        );
        sqlx::query("UPDATE jobs SET state = 'errored', num_failures = 3, failure_message = 'boom' WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    // The dedupe modes leave it as it is.
    let kept = enqueuer
        .enqueue(&job(3, KeyMode::DedupeOnly))
        .await
        .unwrap();
    assert_eq!(kept, Enqueued::Kept(id));
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(failures, 3);
}

/// A claimed (and, in transactional handling, opened) job holding key `k`.
async fn running_holder(
    db: &Db,
    enqueuer: &Enqueuer,
    handling: Handling,
) -> (
    Arc<dbworker::DbStore<common::Job>>,
    dbworker::DbJob<common::Job>,
) {
    let id = enqueuer
        .enqueue(
            &NewJob::new()
                .json("payload", json!({"old": true}))
                .key("k", KeyMode::Replace),
        )
        .await
        .unwrap()
        .id();
    let store = db.store(handling).await;
    let mut jobs = store
        .dequeue("host", &DbConditions::new(), 1)
        .await
        .unwrap();
    let mut job = jobs.pop().unwrap();
    assert_eq!(job.record().id, id);
    assert!(store.open(&mut job).await.unwrap());
    (store, job)
}

#[tokio::test]
async fn concurrent_replacing_enqueuers_on_a_running_key_add_exactly_one_new_job() {
    concurrent_replacing_enqueuers_on_a_running_key_add_exactly_one_new_job_on(Table::Plain).await;
}

#[tokio::test]
async fn on_a_partitioned_table_concurrent_replacing_enqueuers_on_a_running_key_add_exactly_one_new_job()
 {
    concurrent_replacing_enqueuers_on_a_running_key_add_exactly_one_new_job_on(Table::Partitioned)
        .await;
}

async fn concurrent_replacing_enqueuers_on_a_running_key_add_exactly_one_new_job_on(table: Table) {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let (db, enqueuer) = set_up_on(table).await;
        let (store, mut running) = running_holder(&db, &enqueuer, handling).await;
        let running_id = running.record().id;
        let enqueuer = Arc::new(enqueuer);
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = Vec::new();
        for n in 0..8_i64 {
            let (enqueuer, barrier, pool) = (enqueuer.clone(), barrier.clone(), db.pool.clone());
            tasks.push(tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                barrier.wait().await;
                let mode = if n % 2 == 0 {
                    KeyMode::Replace
                } else {
                    KeyMode::PreserveRunAt
                };
                let job = NewJob::new()
                    .json("payload", json!({ "n": n }))
                    .key("k", mode);
                let got = enqueuer.enqueue_in(&mut tx, &job).await.unwrap();
                tx.commit().await.unwrap();
                got
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            // The running job's transaction (FOR KEY SHARE) must not block them.
            let got = tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("enqueues wait for no running job")
                .unwrap();
            results.push(got);
        }
        let inserted: Vec<i64> = results
            .iter()
            .filter_map(|r| match r {
                Enqueued::Inserted(id) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(inserted.len(), 1, "{handling:?}: {results:?}");
        assert!(
            results.iter().all(|r| r.id() == inserted[0]),
            "{handling:?}: {results:?}"
        );
        assert_ne!(inserted[0], running_id);
        let (queued, holders): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FROM jobs WHERE job_key = 'k'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((queued, holders), (1, 1), "{handling:?}");
        // The running attempt still owns its row and completes it.
        assert_eq!(db.state(running_id).await, "processing");
        assert!(
            store.mark_complete(&mut running).await.unwrap(),
            "{handling:?}"
        );
        assert_eq!(db.state(running_id).await, "completed");
    }
}

#[tokio::test]
async fn eight_concurrent_enqueuers_on_one_key_leave_one_live_job() {
    eight_concurrent_enqueuers_on_one_key_leave_one_live_job_on(Table::Plain).await;
}

#[tokio::test]
async fn on_a_partitioned_table_eight_concurrent_enqueuers_on_one_key_leave_one_live_job() {
    eight_concurrent_enqueuers_on_one_key_leave_one_live_job_on(Table::Partitioned).await;
}

async fn eight_concurrent_enqueuers_on_one_key_leave_one_live_job_on(table: Table) {
    let (db, enqueuer) = set_up_on(table).await;
    let enqueuer = Arc::new(enqueuer);
    for (round, mode) in [
        KeyMode::Replace,
        KeyMode::PreserveRunAt,
        KeyMode::DedupeOnly,
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = Vec::new();
        for n in 0..8_i64 {
            let (enqueuer, barrier, pool, key) = (
                enqueuer.clone(),
                barrier.clone(),
                db.pool.clone(),
                key.clone(),
            );
            tasks.push(tokio::spawn(async move {
                // Each on its own connection, all at once, each in a transaction
                // that commits after the others had a chance to run.
                let mut tx = pool.begin().await.unwrap();
                barrier.wait().await;
                let job = NewJob::new()
                    .json("payload", json!({ "n": n }))
                    .key(key, mode);
                let got = enqueuer.enqueue_in(&mut tx, &job).await.unwrap();
                tx.commit().await.unwrap();
                got
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        let ids: Vec<i64> = results.iter().map(Enqueued::id).collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "{mode:?}: {results:?}");
        let inserted = results
            .iter()
            .filter(|r| matches!(r, Enqueued::Inserted(_)))
            .count();
        assert_eq!(inserted, 1, "{mode:?}: {results:?}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE job_key = $1")
            .bind(&key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(rows, 1, "{mode:?}");
    }
}

#[tokio::test]
async fn missing_columns_and_a_missing_key_index_are_named_at_start_up() {
    let db = Db::new().await;
    let err = JobTable::new(&db.pool, full_options()).await.unwrap_err();
    let text = err.to_string();
    for column in ["job_key", "queue", "priority"] {
        assert!(text.contains(column), "{text}");
    }
    let err = JobTable::new(&db.pool, JobTableOptions::new("no_such_jobs"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_jobs"), "{err}");

    // The column without its unique index: keyed inserts could not work.
    sqlx::raw_sql("ALTER TABLE jobs ADD COLUMN job_key text")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut o = Db::table_options();
    o.key_column = Some("job_key".into());
    let err = JobTable::new(&db.pool, o).await.unwrap_err();
    assert!(
        matches!(&err, Error::Schema { problems } if problems[0].contains("unique index")
            && problems[0].contains("jobs.job_key (key_column)")
            && !problems[0].contains("ON CONFLICT")),
        "the column named, no driver text: {err}"
    );

    // Options the table was not configured for are refused, not ignored.
    let plain = Enqueuer::new(&db.pool, &db.table().await).await.unwrap();
    let err = plain
        .enqueue(&NewJob::new().key("k", KeyMode::Replace))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key_column"), "{err}");
    let err = plain
        .enqueue(&NewJob::new().set("state", "completed"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("managed by dbworker"), "{err}");
}

#[tokio::test]
async fn many_jobs_are_split_below_the_bind_parameter_limit() {
    let (db, enqueuer) = set_up().await;
    // Six bound values per row at most: over 10,000 rows per statement.
    let jobs: Vec<NewJob> = (0..25_000)
        .map(|n| NewJob::new().set("cost", n).priority(n % 3).queue("bulk"))
        .collect();
    let ids = enqueuer.enqueue_many(&jobs).await.unwrap();
    assert_eq!(ids.len(), 25_000);
    let (count, max_cost): (i64, i32) =
        sqlx::query_as("SELECT count(*), max(cost) FROM jobs WHERE queue = 'bulk'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((count, max_cost), (25_000, 24_999));
    let last_cost: i32 = db
        .scalar("SELECT cost FROM jobs WHERE id = $1", ids[24_999])
        .await;
    assert_eq!(last_cost, 24_999, "ids come back in input order");
}

/// Calls the generated `jobs_enqueue` SQL function.
async fn sql_enqueue(pool: &sqlx::PgPool, call: &'static str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(call).fetch_one(pool).await
}

#[tokio::test]
async fn the_sql_enqueue_function_inserts_and_honours_keys_like_the_enqueuer() {
    let (db, _) = set_up().await;
    let ddl = enqueue_function_sql("jobs", &Default::default(), OptionalColumns::all()).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    let p = &db.pool;

    let plain = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 1}, "cost": 4}')"#,
    )
    .await
    .unwrap();
    assert_eq!(payload(&db, plain).await, json!({"n": 1}));
    let later = sql_enqueue(
        p,
        "SELECT jobs_enqueue(run_at => now() + interval '1 hour', priority => 3, queue => 'q')",
    )
    .await
    .unwrap();
    assert!(delay_of(&db, later).await.unwrap() > 3500.0);
    let (priority, queue): (i32, String) =
        sqlx::query_as("SELECT priority, queue FROM jobs WHERE id = $1")
            .bind(later)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((priority, queue.as_str()), (3, "q"));

    let first = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 2}}', job_key => 'k')"#,
    )
    .await
    .unwrap();
    let replaced = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 3}}', job_key => 'k')"#,
    )
    .await
    .unwrap();
    assert_eq!(replaced, first);
    assert_eq!(payload(&db, first).await, json!({"n": 3}));
    let kept = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 4}}', job_key => 'k', key_mode => 'dedupe_only')"#,
    )
    .await
    .unwrap();
    assert_eq!(kept, first);
    assert_eq!(payload(&db, first).await, json!({"n": 3}));
    // A processing holder's columns are never changed: the dedupe modes keep
    // it, a replacing mode takes its key for a new job.
    sqlx::query("UPDATE jobs SET state = 'processing' WHERE id = $1")
        .bind(first)
        .execute(p)
        .await
        .unwrap();
    for mode in ["dedupe_only", "unsafe_dedupe"] {
        let kept: i64 = sqlx::query_scalar(
            r#"SELECT jobs_enqueue('{"payload": {"n": 9}}', job_key => 'k', key_mode => $1)"#,
        )
        .bind(mode)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(kept, first, "{mode}");
    }
    let busy = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 5}}', job_key => 'k')"#,
    )
    .await
    .unwrap();
    assert_ne!(busy, first, "a new job carries the work");
    assert_eq!(payload(&db, first).await, json!({"n": 3}));
    assert_eq!(payload(&db, busy).await, json!({"n": 5}));
    let (state, key, limit): (String, Option<String>, Option<i32>) =
        sqlx::query_as("SELECT state, job_key, max_retries FROM jobs WHERE id = $1")
            .bind(first)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((state.as_str(), key, limit), ("processing", None, Some(0)));
    // An errored holder replaced starts over.
    sqlx::query("UPDATE jobs SET state = 'errored', num_failures = 2, failure_message = 'boom' WHERE id = $1")
        .bind(busy)
        .execute(p)
        .await
        .unwrap();
    let updated = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {"n": 6}}', job_key => 'k', key_mode => 'preserve_run_at')"#,
    )
    .await
    .unwrap();
    assert_eq!(updated, busy);
    let (state, failures, message): (String, i32, Option<String>) =
        sqlx::query_as("SELECT state, num_failures, failure_message FROM jobs WHERE id = $1")
            .bind(busy)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((state.as_str(), failures, message), ("queued", 0, None));
    // unsafe_dedupe counts a failed holder; dedupe_only does not.
    sqlx::query("UPDATE jobs SET state = 'failed' WHERE id = $1")
        .bind(busy)
        .execute(p)
        .await
        .unwrap();
    let kept = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {}}', job_key => 'k', key_mode => 'unsafe_dedupe')"#,
    )
    .await
    .unwrap();
    assert_eq!(kept, busy);
    let fresh = sql_enqueue(
        p,
        r#"SELECT jobs_enqueue('{"payload": {}}', job_key => 'k', key_mode => 'dedupe_only')"#,
    )
    .await
    .unwrap();
    assert!(fresh != busy && fresh != first, "{fresh}");

    // Eight sessions racing on one new key: one job.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            sql_enqueue(
                &pool,
                r#"SELECT jobs_enqueue('{"payload": {}}', job_key => 'race', key_mode => 'preserve_run_at')"#,
            )
            .await
            .unwrap()
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap());
    }
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");

    let err = sql_enqueue(p, r#"SELECT jobs_enqueue('{"state": "completed"}')"#)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("managed by dbworker"), "{err}");
    let err = sql_enqueue(
        p,
        "SELECT jobs_enqueue(job_key => 'x', key_mode => 'bogus')",
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("key_mode"), "{err}");
    // A NULL mode (an optional parameter bound as NULL) is refused too, not
    // taken as a replace for a waiting holder and a dedupe for a running one.
    let err = sql_enqueue(p, "SELECT jobs_enqueue(job_key => 'x', key_mode => NULL)")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key_mode"), "{err}");
}

#[tokio::test]
async fn concurrent_sql_enqueues_on_a_running_key_add_exactly_one_new_job() {
    let (db, enqueuer) = set_up().await;
    let ddl = enqueue_function_sql("jobs", &Default::default(), OptionalColumns::all()).unwrap();
    db.execute(&ddl).await;
    let (store, mut running) = running_holder(&db, &enqueuer, Handling::Transactional).await;
    let running_id = running.record().id;
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (pool, barrier) = (db.pool.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            barrier.wait().await;
            let mode = if n % 2 == 0 {
                "replace"
            } else {
                "preserve_run_at"
            };
            let id: i64 = sqlx::query_scalar(
                r#"SELECT jobs_enqueue('{"payload": {}}', job_key => 'k', key_mode => $1)"#,
            )
            .bind(mode)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            id
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        let id = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("enqueues wait for no running job")
            .unwrap();
        ids.push(id);
    }
    assert!(
        ids.iter().all(|id| *id == ids[0] && *id != running_id),
        "{ids:?}"
    );
    let (queued, holders): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FROM jobs WHERE job_key = 'k'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((queued, holders), (1, 1));
    assert!(store.mark_complete(&mut running).await.unwrap());
}

#[tokio::test]
async fn a_jobs_own_retry_limit_wins_over_the_stores_in_both_handling_modes() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let (db, enqueuer) = set_up().await;
        let none = enqueuer
            .enqueue(&NewJob::new().max_retries(0))
            .await
            .unwrap()
            .id();
        let one = enqueuer
            .enqueue(&NewJob::new().max_retries(1))
            .await
            .unwrap()
            .id();
        let default = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
        let mut o = db.options();
        o.handling = handling;
        o.max_num_retries = 5;
        let table = db
            .table_with(|t| t.max_retries_column = Some("max_retries".into()))
            .await;
        let store = dbworker::DbStore::<Job>::new(&db.pool, &table, o)
            .await
            .unwrap();
        // Every job fails once, then whatever is retried fails once more.
        for _ in 0..2 {
            let mut jobs = store
                .dequeue("host", &DbConditions::new(), 10)
                .await
                .unwrap();
            for job in &mut jobs {
                assert!(store.open(job).await.unwrap());
                assert!(
                    store
                        .mark_errored(job, "boom", None)
                        .await
                        .unwrap()
                        .is_some()
                );
            }
        }
        assert_eq!(db.state(none).await, "failed", "{handling:?}: limit 0");
        assert_eq!(db.state(one).await, "failed", "{handling:?}: limit 1");
        assert_eq!(
            db.state(default).await,
            "errored",
            "{handling:?}: the store's 5"
        );
        let failures: i32 = db
            .scalar("SELECT num_failures FROM jobs WHERE id = $1", none)
            .await;
        assert_eq!(failures, 1, "{handling:?}: failed at its first error");
    }
}

#[tokio::test]
async fn a_missing_or_mistyped_retry_limit_column_is_named_at_start_up() {
    let db = Db::new().await;
    let mut o = Db::table_options();
    o.max_retries_column = Some("max_retries".into());
    let err = JobTable::new(&db.pool, o.clone()).await.unwrap_err();
    assert!(err.to_string().contains("max_retries"), "{err}");
    sqlx::raw_sql("ALTER TABLE jobs ADD COLUMN max_retries text")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = JobTable::new(&db.pool, o).await.unwrap_err();
    assert!(err.to_string().contains("expected an integer"), "{err}");
}

#[tokio::test]
async fn copy_loads_many_jobs_with_their_options_all_or_none() {
    let (db, enqueuer) = set_up().await;
    let tricky = json!({"text": "tab\there, newline\nthere, back\\slash, ünïcode"});
    let jobs: Vec<NewJob> = (0..5_000)
        .map(|n| {
            let job = NewJob::new()
                .json(
                    "payload",
                    if n == 0 {
                        tricky.clone()
                    } else {
                        json!({ "n": n })
                    },
                )
                .set("cost", n)
                .priority(n % 4)
                .queue("copied");
            if n % 2 == 0 {
                job.run_after(Duration::from_secs(3600))
            } else {
                job
            }
        })
        .collect();
    assert_eq!(enqueuer.enqueue_copy(&jobs).await.unwrap(), 5_000);
    let (count, delayed, max_priority): (i64, i64, i32) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE process_after > now() + interval '3590 seconds'), max(priority)
         FROM jobs WHERE queue = 'copied'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((count, delayed, max_priority), (5_000, 2_500, 3));
    let first: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM jobs WHERE queue = 'copied' AND cost = 0")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(first, tricky, "escaped for COPY and read back intact");

    // In the caller's transaction: gone with its rollback.
    let mut tx = db.pool.begin().await.unwrap();
    let loaded = enqueuer
        .enqueue_copy_in(&mut tx, &[NewJob::new().set("cost", -1)])
        .await
        .unwrap();
    assert_eq!(loaded, 1);
    tx.rollback().await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE cost = -1")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);

    // COPY cannot ask for a default per row, nor dedupe keys.
    let mixed = [NewJob::new().set("cost", 1), NewJob::new().priority(2)];
    let err = enqueuer.enqueue_copy(&mixed).await.unwrap_err();
    assert!(err.to_string().contains("same columns"), "{err}");
    let keyed = [NewJob::new().key("k", KeyMode::Replace)];
    let err = enqueuer.enqueue_copy(&keyed).await.unwrap_err();
    assert!(err.to_string().contains("keyed"), "{err}");
}

/// graphile-worker's length limits: a queue or kind over 128 characters, a
/// key over 512, is refused with the field named, and nothing is inserted.
#[tokio::test]
async fn overlong_queue_and_key_names_are_refused_and_nothing_is_inserted() {
    let (db, enqueuer) = set_up().await;
    let long = |n: usize| "é".repeat(n);
    let ok = enqueuer
        .enqueue(
            &NewJob::new()
                .queue(long(128))
                .key(long(512), KeyMode::Replace),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    for (job, field) in [
        (NewJob::new().queue(long(129)), "queue"),
        (NewJob::new().key(long(513), KeyMode::Replace), "key"),
    ] {
        let err = enqueuer.enqueue(&job).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains(field) && text.contains("at most"), "{text}");
    }
    let err = enqueuer
        .enqueue_many(&[NewJob::new(), NewJob::new().queue(long(200))])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "only the job within the limits");
}
