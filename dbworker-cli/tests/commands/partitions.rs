//! Partitioned job tables through the binary: `dbworker migration
//! --partitioned` prints a table every feature runs on (and refuses the
//! features that cannot), `dbworker partitions create` makes upcoming
//! partitions, and `dbworker purge --once` drops an old partition whole.

use crate::cli;
use crate::common;

use dbworker_testkit::TestDatabase;

use cli::{dbworker, ok, refused};
use common::Db;

#[tokio::test]
async fn migration_refuses_what_a_partitioned_table_cannot_carry() {
    let db = Db::new().await;
    let err = refused(&dbworker(
        &db,
        &["migration", "--partitioned", "--workflows"],
    ));
    assert!(
        err.contains("--workflows cannot be used with --partitioned"),
        "{err}"
    );
    let err = refused(&dbworker(
        &db,
        &["migration", "--partitioned", "--keys", "--enqueue-function"],
    ));
    assert!(
        err.contains("--enqueue-function and --add-jobs with --keys"),
        "{err}"
    );
    let err = refused(&dbworker(
        &db,
        &[
            "migration",
            "--partitioned",
            "--partition-interval",
            "fortnight",
        ],
    ));
    assert!(err.contains("partition_interval"), "{err}");
    // Without --keys the enqueue function works on a partitioned table.
    ok(&dbworker(
        &db,
        &["migration", "--partitioned", "--enqueue-function"],
    ));
}

#[tokio::test]
async fn partitions_are_created_ahead_and_purge_drops_an_old_one_whole() {
    let test_db = TestDatabase::new().await.expect("test database");
    let pool = test_db.pool(5).await.expect("pool");
    let db = Db { db: test_db, pool };
    let ddl = ok(&dbworker(
        &db,
        &[
            "migration",
            "--partitioned",
            "--keys",
            "--queue",
            "--retention",
            "--limits",
            "--pauses",
        ],
    ));
    db.execute(&ddl).await;
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'jobs'::regclass")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(kind, "p");

    // Three days back: one finished job in a partition of its own.
    db.execute(
        "SELECT jobs_create_partitions(0, now() - interval '3 days');
         INSERT INTO jobs (state, queued_at, finished_at, job_key)
           VALUES ('completed', now() - interval '3 days', now() - interval '2 days', 'k');
         INSERT INTO jobs (job_key) VALUES ('k');",
    )
    .await;

    let out = ok(&dbworker(&db, &["partitions", "create", "--ahead", "5"]));
    assert_eq!(out.matches("created jobs_p").count(), 2, "{out}");
    assert!(out.contains("2 partition(s) created"), "{out}");
    let out = ok(&dbworker(&db, &["partitions", "create", "--ahead", "5"]));
    assert!(out.contains("0 partition(s) created"), "{out}");

    let out = ok(&dbworker(
        &db,
        &["purge", "--completed-after-secs", "3600", "--once"],
    ));
    assert!(out.contains("dropped partition"), "{out}");
    assert!(out.contains("(1 job(s))"), "{out}");
    let left: Vec<String> = sqlx::query_scalar("SELECT state FROM jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, ["queued"], "the live keyed job stays");

    let plain = Db::new().await;
    let err = refused(&dbworker(&plain, &["partitions", "create"]));
    assert!(err.contains("is not a partitioned table"), "{err}");
}
