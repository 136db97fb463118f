//! `dbworker complete`, `dbworker reschedule` and `dbworker remove --key`
//! through the binary against real Postgres: on one id or a filter, never
//! touching a job a worker holds.

use crate::cli;
use crate::common;

use dbworker::ddl::OptionalColumns;

use cli::{dbworker, ok, refused};
use common::Db;

async fn job(db: &Db, state: &str, key: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (state, num_failures, job_key, queue) VALUES ($1, 3, $2, 'mail') RETURNING id",
    )
    .bind(state)
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn complete_reschedule_and_remove_leave_processing_jobs_alone() {
    let db = Db::new().await;
    db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
    let failed = job(&db, "failed", "f").await;
    let processing = job(&db, "processing", "p").await;
    let queued = job(&db, "queued", "q").await;
    let errored = job(&db, "errored", "e").await;

    // complete: one id; a processing job is refused.
    let out = ok(&dbworker(&db, &["complete", &queued.to_string()]));
    assert!(out.contains(&format!("completed job {queued}")), "{out}");
    assert_eq!(db.state(queued).await, "completed");
    let err = refused(&dbworker(&db, &["complete", &processing.to_string()]));
    assert!(err.contains("processing job is left alone"), "{err}");
    assert_eq!(db.state(processing).await, "processing");

    // reschedule: on a filter, with every value.
    let out = ok(&dbworker(
        &db,
        &[
            "reschedule",
            "--queue-column",
            "queue",
            "--queue",
            "mail",
            "--yes",
            "--run-at",
            "2100-01-01T00:00:00Z",
            "--priority",
            "-2",
            "--attempts",
            "0",
            "--max-attempts",
            "4",
        ],
    ));
    assert!(out.contains("rescheduled 2 job(s)"), "{out}");
    let read = |id| {
        sqlx::query_as::<_, (String, i32, i32, Option<i32>, Option<f64>)>(
            "SELECT state, num_failures, priority, max_retries,
                    EXTRACT(YEAR FROM process_after)::float8 FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
    };
    for id in [failed, errored] {
        let (state, failures, priority, limit, year) = read(id).await.unwrap();
        assert_eq!(
            (state.as_str(), failures, priority, limit, year),
            ("queued", 0, -2, Some(3), Some(2100.0))
        );
    }
    let (state, failures, priority, _, _) = read(processing).await.unwrap();
    assert_eq!((state.as_str(), failures, priority), ("processing", 3, 0));

    // Only a delay, by the database clock: the rest stays.
    ok(&dbworker(
        &db,
        &["reschedule", &failed.to_string(), "--run-in-secs", "600"],
    ));
    let delay: f64 = db
        .scalar(
            "SELECT EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1",
            failed,
        )
        .await;
    assert!((590.0..=600.0).contains(&delay), "{delay}");
    assert_eq!(read(failed).await.unwrap().2, -2);
    let err = refused(&dbworker(
        &db,
        &["reschedule", &failed.to_string(), "--run-at", "tomorrow"],
    ));
    assert!(err.contains("RFC 3339"), "{err}");

    // remove --key: a waiting holder goes; a processing one runs on without
    // the key and its retries.
    let out = ok(&dbworker(&db, &["remove", "--key", "e"]));
    assert!(out.contains(&format!("removed job {errored}")), "{out}");
    let left: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", errored)
        .await;
    assert_eq!(left, 0);
    let out = ok(&dbworker(&db, &["remove", "--key", "p"]));
    assert!(out.contains("runs on without the key"), "{out}");
    assert_eq!(db.state(processing).await, "processing");
    let err = refused(&dbworker(&db, &["remove", "--key", "nothing"]));
    assert!(err.contains("no queued or errored job"), "{err}");
}

#[tokio::test]
async fn migration_prints_the_sql_functions_that_install_and_run() {
    let db = Db::new().await;
    let ddl = ok(&dbworker(
        &db,
        &[
            "migration",
            "--keys",
            "--priority",
            "--add-jobs",
            "--admin-functions",
        ],
    ));
    for function in [
        "\"jobs_enqueue\"(",
        "\"jobs_add_jobs\"(",
        "\"jobs_complete_jobs\"(",
        "\"jobs_permanently_fail_jobs\"(",
        "\"jobs_reschedule_jobs\"(",
        "\"jobs_remove_job\"(",
    ] {
        assert!(ddl.contains(function), "{function}: {ddl}");
    }
    // The table exists already: install what comes after it.
    let functions = &ddl[ddl.find("-- Job keys").unwrap()..];
    db.execute(functions).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(vec![serde_json::json!({"priority": 2, "job_key": "a"})])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let outcome: String = sqlx::query_scalar("SELECT outcome FROM jobs_complete_jobs($1)")
        .bind(&ids)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(outcome, "done");
}
