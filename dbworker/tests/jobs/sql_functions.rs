//! The generated SQL functions called through plain SQL, as a program in any
//! language would: the admin functions (`complete_jobs`,
//! `permanently_fail_jobs`, `reschedule_jobs`, `remove_job`), each leaving a
//! processing job alone and saying so, and `add_jobs` with keys.

use crate::common;

use std::collections::HashMap;

use dbworker::ddl::{
    OptionalColumns, add_jobs_function_sql, admin_functions_sql, enqueue_function_sql,
};
use serde_json::json;

use common::Db;

/// The test table with every optional column and the functions installed.
async fn set_up() -> Db {
    Db::with_sql_functions().await
}

/// One job per state, keyed `key-<state>`; returns their ids by state.
async fn seed(db: &Db) -> HashMap<&'static str, i64> {
    let mut ids = HashMap::new();
    for state in [
        "queued",
        "errored",
        "processing",
        "failed",
        "completed",
        "canceled",
    ] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobs (state, num_failures, failure_message, job_key, priority, max_retries)
             VALUES ($1, 2, 'boom', 'key-' || $1, 1, 4) RETURNING id",
        )
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ids.insert(state, id);
    }
    ids
}

/// `(id, outcome)` rows of an admin function.
async fn call(db: &Db, sql: &'static str, ids: &[i64]) -> Vec<(i64, String)> {
    sqlx::query_as(sql)
        .bind(ids)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

fn outcomes(rows: &[(i64, String)]) -> Vec<&str> {
    rows.iter().map(|(_, o)| o.as_str()).collect()
}

#[tokio::test]
async fn complete_and_permanently_fail_leave_processing_jobs_alone_and_say_so() {
    let db = set_up().await;
    let ids = seed(&db).await;
    let all = [
        ids["queued"],
        ids["processing"],
        ids["completed"],
        ids["failed"],
        999_999,
    ];

    let rows = call(&db, "SELECT * FROM jobs_complete_jobs($1)", &all).await;
    assert_eq!(
        rows.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        all,
        "one row per requested id, in order"
    );
    assert_eq!(
        outcomes(&rows),
        ["done", "processing", "skipped", "done", "missing"]
    );
    assert_eq!(db.state(ids["queued"]).await, "completed");
    assert_eq!(db.state(ids["failed"]).await, "completed");
    assert_eq!(db.state(ids["processing"]).await, "processing");

    let rows = sqlx::query_as::<_, (i64, String)>(
        "SELECT * FROM jobs_permanently_fail_jobs($1, 'bad input')",
    )
    .bind(vec![ids["errored"], ids["processing"], ids["canceled"]])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(outcomes(&rows), ["done", "processing", "skipped"]);
    let (state, message): (String, String) =
        sqlx::query_as("SELECT state, failure_message FROM jobs WHERE id = $1")
            .bind(ids["errored"])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), message.as_str()), ("failed", "bad input"));
    let message: String = db
        .scalar(
            "SELECT failure_message FROM jobs WHERE id = $1",
            ids["processing"],
        )
        .await;
    assert_eq!(message, "boom", "the processing job is untouched");
}

#[tokio::test]
async fn reschedule_changes_only_the_fields_given() {
    let db = set_up().await;
    let ids = seed(&db).await;
    let rows = call(
        &db,
        "SELECT * FROM jobs_reschedule_jobs($1, run_at => now() + interval '1 hour', priority => 7, num_failures => 0)",
        &[ids["failed"], ids["processing"], ids["completed"]],
    )
    .await;
    assert_eq!(outcomes(&rows), ["done", "processing", "skipped"]);
    let row = |id| {
        sqlx::query_as::<_, (String, i32, i32, Option<i32>, Option<f64>)>(
            "SELECT state, priority, num_failures, max_retries,
                    EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
    };
    let (state, priority, failures, limit, delay) = row(ids["failed"]).await.unwrap();
    assert_eq!(
        (state.as_str(), priority, failures, limit),
        ("queued", 7, 0, Some(4)),
        "max_retries not given: unchanged"
    );
    assert!(delay > Some(3500.0), "{delay:?}");
    let (state, priority, failures, _, _) = row(ids["processing"]).await.unwrap();
    assert_eq!((state.as_str(), priority, failures), ("processing", 1, 2));

    // Only max_retries given: the rest stays.
    let rows = call(
        &db,
        "SELECT * FROM jobs_reschedule_jobs($1, max_retries => 9)",
        &[ids["failed"]],
    )
    .await;
    assert_eq!(outcomes(&rows), ["done"]);
    let (_, priority, failures, limit, delay) = row(ids["failed"]).await.unwrap();
    assert_eq!((priority, failures, limit), (7, 0, Some(9)));
    assert!(delay > Some(3500.0), "run_at not given: unchanged");
}

#[tokio::test]
async fn remove_job_deletes_a_waiting_holder_and_ends_a_processing_ones_retries() {
    let db = set_up().await;
    let ids = seed(&db).await;
    let remove = |key: &'static str| {
        sqlx::query_as::<_, (i64, String)>("SELECT * FROM jobs_remove_job($1)")
            .bind(key)
            .fetch_all(&db.pool)
    };
    assert_eq!(
        remove("key-queued").await.unwrap(),
        [(ids["queued"], "done".to_owned())]
    );
    let gone: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", ids["queued"])
        .await;
    assert_eq!(gone, 0);
    assert_eq!(
        remove("key-processing").await.unwrap(),
        [(ids["processing"], "processing".to_owned())]
    );
    assert_eq!(db.state(ids["processing"]).await, "processing");
    // It runs on without its key, and its limit (4) is now its failures so
    // far (2): a failure will not be retried.
    let (key, limit): (Option<String>, i32) =
        sqlx::query_as("SELECT job_key, max_retries FROM jobs WHERE id = $1")
            .bind(ids["processing"])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((key, limit), (None, 2));
    // A finished job holds no key; nothing to remove.
    assert!(remove("key-failed").await.unwrap().is_empty());
    assert_eq!(db.state(ids["failed"]).await, "failed");
}

#[tokio::test]
async fn add_jobs_enqueues_in_order_and_applies_keys_per_spec() {
    let db = set_up().await;
    let specs = vec![
        json!({"fields": {"payload": {"n": 1}, "cost": 3}, "priority": 5, "queue": "q"}),
        json!({"fields": {"payload": {"n": 2}}, "job_key": "k", "run_at": "2100-01-01T00:00:00Z"}),
        json!({"fields": {"payload": {"n": 3}}, "job_key": "k"}),
        json!({"max_retries": 2, "kind": "mail"}),
    ];
    let ids: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(&specs)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(ids[1], ids[2], "the second keyed spec replaced the first");
    let (payload, cost, priority, queue): (serde_json::Value, i32, i32, String) =
        sqlx::query_as("SELECT payload, cost, priority, queue FROM jobs WHERE id = $1")
            .bind(ids[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (payload, cost, priority, queue.as_str()),
        (json!({"n": 1}), 3, 5, "q")
    );
    let payload: serde_json::Value = db
        .scalar("SELECT payload FROM jobs WHERE id = $1", ids[1])
        .await;
    assert_eq!(payload, json!({"n": 3}));
    let (limit, kind): (Option<i32>, String) =
        sqlx::query_as("SELECT max_retries, kind FROM jobs WHERE id = $1")
            .bind(ids[3])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((limit, kind.as_str()), (Some(2), "mail"));

    // replace takes the new job's run-at, none (at once) included, as
    // `Enqueuer` does.
    let due_now: bool = db
        .scalar(
            "SELECT process_after IS NULL FROM jobs WHERE id = $1",
            ids[1],
        )
        .await;
    assert!(due_now, "replaced without a run-at: due at once");
    sqlx::query("UPDATE jobs SET process_after = '2100-01-01T00:00:00Z' WHERE id = $1")
        .bind(ids[1])
        .execute(&db.pool)
        .await
        .unwrap();
    // preserve_run_at keeps the holder's run-at; a processing holder gives
    // its key to a new job, as with the enqueue function.
    let again: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1, 'preserve_run_at')")
        .bind(vec![json!({"fields": {"payload": {"n": 4}}, "job_key": "k", "run_at": "2000-01-01T00:00:00Z"})])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(again, [ids[1]]);
    let year: f64 = db
        .scalar(
            "SELECT EXTRACT(YEAR FROM process_after)::float8 FROM jobs WHERE id = $1",
            ids[1],
        )
        .await;
    assert_eq!(year, 2100.0);
    // ... unless the holder failed before: that run-at was a retry's.
    sqlx::query("UPDATE jobs SET state = 'errored', num_failures = 2 WHERE id = $1")
        .bind(ids[1])
        .execute(&db.pool)
        .await
        .unwrap();
    let retaken: Vec<i64> = sqlx::query_scalar(
        "SELECT * FROM jobs_add_jobs($1, 'preserve_run_at')",
    )
    .bind(vec![
        json!({"fields": {"payload": {"n": 4}}, "job_key": "k", "run_at": "2000-01-01T00:00:00Z"}),
    ])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(retaken, [ids[1]]);
    let (year, failures): (f64, i32) = sqlx::query_as(
        "SELECT EXTRACT(YEAR FROM process_after)::float8, num_failures FROM jobs WHERE id = $1",
    )
    .bind(ids[1])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((year, failures), (2000.0, 0));
    sqlx::query("UPDATE jobs SET state = 'processing' WHERE id = $1")
        .bind(ids[1])
        .execute(&db.pool)
        .await
        .unwrap();
    let fresh: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(vec![
            json!({"fields": {"payload": {"n": 5}}, "job_key": "k"}),
        ])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_ne!(fresh, [ids[1]]);

    // A typo is named, and the whole call is one statement: nothing is added.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let err = sqlx::query_scalar::<_, i64>("SELECT * FROM jobs_add_jobs($1)")
        .bind(vec![json!({"fields": {}}), json!({"max_attempts": 3})])
        .fetch_all(&db.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(before, after);
}

#[tokio::test]
async fn the_functions_follow_renamed_columns_and_tables_without_optional_columns() {
    let renames = HashMap::from([
        ("state".to_owned(), "status".to_owned()),
        ("num_failures".to_owned(), "attempts".to_owned()),
    ]);
    let db = Db::with_renames(&renames).await;
    let none = OptionalColumns::default();
    db.execute(&enqueue_function_sql("jobs", &renames, none).unwrap())
        .await;
    db.execute(&add_jobs_function_sql("jobs", &renames, none).unwrap())
        .await;
    db.execute(&admin_functions_sql("jobs", &renames, none).unwrap())
        .await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(vec![json!({}), json!({"fields": {"cost": 2}})])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET status = 'processing' WHERE id = $1")
        .bind(ids[1])
        .execute(&db.pool)
        .await
        .unwrap();
    let rows = call(
        &db,
        "SELECT * FROM jobs_reschedule_jobs($1, num_failures => 5)",
        &ids,
    )
    .await;
    assert_eq!(outcomes(&rows), ["done", "processing"]);
    let attempts: i32 = db
        .scalar("SELECT attempts FROM jobs WHERE id = $1", ids[0])
        .await;
    assert_eq!(attempts, 5);
}

/// `add_jobs` sets the flags of each spec (a JSON array) like `enqueue` does.
#[tokio::test]
async fn add_jobs_sets_each_specs_flags() {
    let db = set_up().await;
    let specs = vec![
        json!({"fields": {"payload": {}}, "flags": ["slow-api", "gpu"]}),
        json!({"fields": {"payload": {}}}),
    ];
    let ids: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(&specs)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let flags = |id: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<Vec<String>>>("SELECT flags FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        flags(ids[0]).await,
        Some(vec!["slow-api".to_owned(), "gpu".to_owned()])
    );
    assert_eq!(flags(ids[1]).await, None);
}

/// `complete_jobs` and `permanently_fail_jobs` stamp `finished_at` with the
/// clock, not with the start of a caller's transaction that began long
/// before (retention and the history read it). Before, both wrote `now()`.
#[tokio::test]
async fn admin_functions_in_a_long_transaction_stamp_the_current_time() {
    let db = set_up().await;
    let ids = seed(&db).await;
    let (mut tx, before) = db.long_transaction().await;
    for (sql, id) in [
        ("SELECT * FROM jobs_complete_jobs($1)", ids["queued"]),
        (
            "SELECT * FROM jobs_permanently_fail_jobs($1)",
            ids["errored"],
        ),
    ] {
        let (_, outcome): (i64, String) = sqlx::query_as(sql)
            .bind(vec![id])
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(outcome, "done");
        let finished: f64 = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM finished_at)::float8 FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert!(
            finished >= before,
            "{sql}: finished {:.2} s before the call",
            before - finished
        );
    }
    tx.commit().await.unwrap();
}
