//! Bad input to the binary against real Postgres: negative counts to
//! `dbworker reschedule` are refused naming the flag, and `dbworker
//! migration` printed again with other columns replaces the SQL functions
//! instead of adding overloads that make every call ambiguous.

use crate::cli;
use crate::common;

use cli::{dbworker, ok, refused};
use common::Db;

#[tokio::test]
async fn reschedule_refuses_negative_counts_naming_the_flag() {
    let db = Db::new().await;
    db.add_columns(|c| c.max_retries = true, &[]).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, num_failures, max_retries) VALUES ('failed', 2, 4) RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // (given, named): clap names an alias by its flag.
    for (given, named, value) in [
        ("--attempts", "--attempts", "-3"),
        ("--num-failures", "--attempts", "-3"),
        ("--max-retries", "--max-retries", "-1"),
    ] {
        let err = refused(&dbworker(
            &db,
            &["reschedule", &id.to_string(), &format!("{given}={value}")],
        ));
        assert!(
            err.contains(&format!("invalid value '{value}' for '{named}")),
            "{given}: {err}"
        );
    }
    let row: (String, i32, Option<i32>) =
        sqlx::query_as("SELECT state, num_failures, max_retries FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(row, ("failed".to_owned(), 2, Some(4)), "nothing changed");
    ok(&dbworker(
        &db,
        &[
            "reschedule",
            &id.to_string(),
            "--attempts=0",
            "--max-retries=0",
        ],
    ));
    assert_eq!(db.state(id).await, "queued");
}

#[tokio::test]
async fn migration_printed_again_with_more_columns_replaces_the_functions() {
    let db = Db::new().await;
    let functions = ["--enqueue-function", "--add-jobs", "--admin-functions"];
    let first = ok(&dbworker(&db, &[&["migration"], &functions[..]].concat()));
    db.execute(&first).await;
    // Later, the table gets kinds and priorities, and the migration is printed again.
    let again = ok(&dbworker(
        &db,
        &[&["migration", "--kind", "--priority"], &functions[..]].concat(),
    ));
    db.execute(&again).await;
    for name in ["jobs_enqueue", "jobs_add_jobs", "jobs_reschedule_jobs"] {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_proc WHERE proname = $1")
            .bind(name)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(count, 1, "{name}");
    }
    let id: i64 = sqlx::query_scalar("SELECT jobs_enqueue('{\"cost\": 1}', kind => 'mail')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let plain: i64 = sqlx::query_scalar("SELECT jobs_enqueue('{}')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT * FROM jobs_reschedule_jobs($1)")
        .bind([id, plain])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
}
