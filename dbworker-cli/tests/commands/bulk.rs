//! A bulk command acts only on the jobs it counted: jobs enqueued while it
//! runs (or while its question waits) are left alone, and it says when it
//! acted on fewer than it counted.

use crate::cli;
use crate::common;

use cli::{dbworker, ok};
use common::Db;

#[tokio::test]
async fn a_bulk_command_acts_only_on_the_jobs_it_counted_and_says_when_fewer() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (state, queue) SELECT 'queued', 'mail' FROM generate_series(1, 3)",
    )
    .await;
    let first: i64 = sqlx::query_scalar("SELECT min(id) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Each batch enqueues another matching job (a busy producer), and a
    // worker takes the first job before the command reaches it.
    db.execute(&format!(
        "CREATE FUNCTION enqueue_more() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF (SELECT count(*) FROM jobs) < 20 THEN
             INSERT INTO jobs (state, queue) VALUES ('queued', 'mail');
           END IF;
           RETURN NULL;
         END $$;
         CREATE TRIGGER enqueue_more AFTER UPDATE ON jobs FOR EACH STATEMENT EXECUTE FUNCTION enqueue_more();
         CREATE FUNCTION taken() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER taken BEFORE UPDATE ON jobs FOR EACH ROW WHEN (OLD.id = {first}) EXECUTE FUNCTION taken();"
    ))
    .await;
    let done = ok(&dbworker(
        &db,
        &[
            "fail",
            "--queue-column",
            "queue",
            "--queue",
            "mail",
            "--state",
            "queued",
            "--chunk-size",
            "1",
            "--yes",
        ],
    ));
    assert!(done.contains("failed 2 job(s)"), "{done}");
    assert!(
        done.contains("2 of the 3 job(s) counted; 1 changed state meanwhile"),
        "{done}"
    );
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'failed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failed, 2);
    let newer: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE state = 'queued' AND id > $1",
            first + 2,
        )
        .await;
    assert!(newer > 0, "jobs were enqueued meanwhile");
}
