//! Bad arguments to the generated SQL functions, called through plain SQL as
//! a program in any language would, refused with an error naming them and
//! changing nothing: negative counts to `reschedule_jobs` (and to
//! `Admin`), a bogus `key_mode` to `add_jobs`, too many ids, self-edges,
//! NULLs and cycles to `wait_for`; and the functions generated again with
//! other columns replace the old ones instead of overloading them.

use crate::common;

use std::collections::HashMap;

use dbworker::{
    admin::{Admin, BulkAction, Reschedule},
    ddl::{
        OptionalColumns, add_jobs_function_sql, admin_functions_sql, enqueue_function_sql,
        workflows_sql,
    },
};
use serde_json::json;

use common::Db;

/// The test table with every optional column and the functions installed.
async fn set_up() -> Db {
    Db::with_sql_functions().await
}

/// The error `sql` (binding `ids`) fails with.
async fn refused(db: &Db, sql: &'static str, ids: &[i64]) -> String {
    sqlx::query(sql)
        .bind(ids)
        .execute(&db.pool)
        .await
        .expect_err(sql)
        .to_string()
}

async fn failed_job(db: &Db) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (state, num_failures, max_retries) VALUES ('failed', 2, 4) RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// `(state, num_failures, max_retries)` of job `id`.
async fn counts(db: &Db, id: i64) -> (String, i32, Option<i32>) {
    sqlx::query_as("SELECT state, num_failures, max_retries FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn negative_counts_are_refused_by_reschedule_jobs_and_admin() {
    let db = set_up().await;
    let id = failed_job(&db).await;
    for (sql, why) in [
        (
            "SELECT * FROM jobs_reschedule_jobs($1, num_failures => -3)",
            "num_failures must be 0 or more, not -3",
        ),
        (
            "SELECT * FROM jobs_reschedule_jobs($1, max_retries => -1)",
            "max_retries must be 0 or more, not -1",
        ),
    ] {
        let err = refused(&db, sql, &[id]).await;
        assert!(err.contains(why), "{err}");
    }
    let table = db
        .table_with(|t| t.max_retries_column = Some("max_retries".into()))
        .await;
    let admin = Admin::new(&db.pool, &table).await.unwrap();
    for (set, field) in [
        (
            (|r: &mut Reschedule| r.num_failures = Some(-3)) as fn(&mut Reschedule),
            "`num_failures`",
        ),
        (
            |r: &mut Reschedule| r.max_retries = Some(-1),
            "`max_retries`",
        ),
    ] {
        let mut r = Reschedule::default();
        set(&mut r);
        let err = admin
            .act_on_ids(&[id], &BulkAction::Reschedule(r))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(field) && err.contains("negative"), "{err}");
    }
    assert_eq!(counts(&db, id).await, ("failed".into(), 2, Some(4)));
    // Zero is fine.
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT * FROM jobs_reschedule_jobs($1, num_failures => 0, max_retries => 0)",
    )
    .bind([id])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows, [(id, "done".to_owned())]);
    assert_eq!(counts(&db, id).await, ("queued".into(), 0, Some(0)));
}

#[tokio::test]
async fn add_jobs_refuses_a_bogus_key_mode_even_without_keys() {
    let db = set_up().await;
    let err = sqlx::query("SELECT * FROM jobs_add_jobs($1, 'sometimes')")
        .bind(vec![json!({ "fields": { "cost": 1 } })])
        .execute(&db.pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "key_mode must be replace, preserve_run_at, dedupe_only or unsafe_dedupe, not sometimes"
        ),
        "{err}"
    );
    assert_eq!(db.count("queued").await, 0);
}

#[tokio::test]
async fn the_admin_functions_take_at_most_ten_thousand_ids_per_call() {
    let db = set_up().await;
    let id = failed_job(&db).await;
    let mut many: Vec<i64> = (1_000_000..1_010_000).collect();
    many[0] = id;
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs_complete_jobs($1) WHERE outcome = 'done'")
            .bind(&many)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(done, 1, "10,000 ids are taken");
    many.push(1_010_000);
    for sql in [
        "SELECT * FROM jobs_complete_jobs($1)",
        "SELECT * FROM jobs_permanently_fail_jobs($1, 'why')",
        "SELECT * FROM jobs_reschedule_jobs($1, num_failures => 0)",
    ] {
        let err = refused(&db, sql, &many).await;
        assert!(
            err.contains("at most 10000 ids per call, not 10001"),
            "{sql}: {err}"
        );
    }
}

#[tokio::test]
async fn wait_for_refuses_self_edges_nulls_and_cycles() {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    let ids = db.enqueue(4, json!({})).await;
    let (a, b, c, d) = (ids[0], ids[1], ids[2], ids[3]);
    let wait = |job: i64, after: &str| {
        let sql = format!("SELECT jobs_wait_for({job}, {after})");
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let cases = [
        (
            a,
            format!("ARRAY[{a}]"),
            format!("job {a} cannot wait for itself"),
        ),
        (
            a,
            format!("ARRAY[{b}, {a}]"),
            format!("job {a} cannot wait for itself"),
        ),
        (
            a,
            "ARRAY[NULL]::bigint[]".to_owned(),
            "without NULL".to_owned(),
        ),
        (a, format!("ARRAY[{b}, NULL]"), "without NULL".to_owned()),
        (a, "NULL".to_owned(), "without NULL".to_owned()),
    ];
    for (job, after, why) in &cases {
        let err = wait(*job, after).await.unwrap_err();
        assert!(err.contains(why.as_str()), "{after}: {err}");
    }
    // b waits for a, c for b: a (or b) waiting for c would close a cycle.
    assert_eq!(wait(b, &format!("ARRAY[{a}]")).await.unwrap(), "pending");
    assert_eq!(wait(c, &format!("ARRAY[{b}]")).await.unwrap(), "pending");
    let err = wait(a, &format!("ARRAY[{d}, {c}]")).await.unwrap_err();
    assert!(
        err.contains(&format!(
            "job {a} cannot wait for job {c}, which already waits for it"
        )),
        "{err}"
    );
    let err = wait(a, &format!("ARRAY[{b}]")).await.unwrap_err();
    assert!(err.contains("would form a cycle"), "{err}");
    for job in [a, d] {
        assert_eq!(db.state(job).await, "queued", "nothing changed");
    }
    let upstream: Option<Vec<i64>> = db
        .scalar("SELECT upstream_ids FROM jobs WHERE id = $1", a)
        .await;
    assert_eq!(upstream, None);
    // Waiting for a job outside the cycle is fine.
    assert_eq!(wait(a, &format!("ARRAY[{d}]")).await.unwrap(), "pending");
}

/// The arguments of every function named `name`, in any schema.
async fn overloads(db: &Db, name: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = $1 ORDER BY 1",
    )
    .bind(name)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn functions_generated_again_with_other_columns_replace_the_old_ones() {
    let db = Db::new().await;
    let install = |columns: OptionalColumns| {
        let renames = HashMap::new();
        [
            enqueue_function_sql("jobs", &renames, columns).unwrap(),
            add_jobs_function_sql("jobs", &renames, columns).unwrap(),
            admin_functions_sql("jobs", &renames, columns).unwrap(),
        ]
        .concat()
    };
    let mut columns = OptionalColumns::default();
    db.add_columns(|_| {}, &[install(columns)]).await;
    columns.kind = true;
    columns.priority = true;
    db.add_columns(|c| *c = columns, &[install(columns)]).await;
    // Installing the same again keeps the one function.
    db.execute(&install(columns)).await;
    for name in ["jobs_enqueue", "jobs_add_jobs", "jobs_reschedule_jobs"] {
        assert_eq!(overloads(&db, name).await.len(), 1, "{name}");
    }
    let id: i64 = sqlx::query_scalar("SELECT jobs_enqueue('{\"cost\": 2}')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let ids: Vec<i64> = sqlx::query_scalar("SELECT * FROM jobs_add_jobs($1)")
        .bind(vec![json!({ "kind": "mail" })])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT * FROM jobs_reschedule_jobs($1)")
        .bind([id, ids[0]])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    // Fewer columns again: the wider overloads go too.
    db.execute(&install(OptionalColumns::default())).await;
    assert_eq!(
        overloads(&db, "jobs_reschedule_jobs").await,
        ["ids bigint[], run_at timestamp with time zone, num_failures integer"]
    );
    // A function of the same name in another schema is not touched.
    db.execute("CREATE SCHEMA other; CREATE FUNCTION other.jobs_enqueue(x int) RETURNS int LANGUAGE sql AS 'SELECT x'")
        .await;
    db.execute(&install(columns)).await;
    assert_eq!(overloads(&db, "jobs_enqueue").await.len(), 2);
}

/// The SQL enqueue function applies `Enqueuer`'s length limits: a queue or
/// kind over 128 characters, a job key or a fairness key over 512, refused
/// with the parameter named; `add_jobs` (which calls it) too.
#[tokio::test]
async fn the_enqueue_function_refuses_overlong_names_like_the_enqueuer() {
    let db = set_up().await;
    let ok: i64 = sqlx::query_scalar(
        "SELECT jobs_enqueue('{}', queue => repeat('é', 128), kind => repeat('é', 128), job_key => repeat('é', 512))",
    )
    .fetch_one(&db.pool)
    .await
    .expect("at the limits");
    assert!(ok > 0);
    for (sql, field, max) in [
        (
            "SELECT jobs_enqueue('{}', queue => repeat('é', 129))",
            "queue",
            "128",
        ),
        (
            "SELECT jobs_enqueue('{}', kind => repeat('é', 129))",
            "kind",
            "128",
        ),
        (
            "SELECT jobs_enqueue('{}', job_key => repeat('é', 513))",
            "job_key",
            "512",
        ),
        (
            "SELECT jobs_enqueue(jsonb_build_object('fair_key', repeat('é', 513)))",
            "fair_key",
            "512",
        ),
        (
            "SELECT * FROM jobs_add_jobs(ARRAY[jsonb_build_object('queue', repeat('é', 129))])",
            "queue",
            "128",
        ),
    ] {
        let err = sqlx::query(sql)
            .execute(&db.pool)
            .await
            .expect_err(sql)
            .to_string();
        assert!(
            err.contains(&format!("{field} is 129 characters long"))
                || err.contains(&format!("{field} is 513 characters long")),
            "{sql}: {err}"
        );
        assert!(err.contains(&format!("at most {max}")), "{sql}: {err}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "only the job within the limits");
}
