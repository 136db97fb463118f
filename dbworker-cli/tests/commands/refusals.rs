//! Operator input the commands refuse with a clear error and a non-zero
//! exit, changing nothing: a blank queue name for `pause` and `resume`, a
//! state a bulk action never touches.

use crate::cli;
use crate::common;

use dbworker::{control::DEFAULT_PAUSE_TABLE, ddl::pause_table_sql};

use cli::{dbworker, ok, refused};
use common::Db;

async fn pauses(db: &Db) -> Vec<String> {
    sqlx::query_scalar("SELECT queue FROM dbworker_pauses ORDER BY queue")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// An empty or blank `--queue` once paused (or resumed) a queue named so, or
/// the whole table through the library; a padded one is a typo.
#[tokio::test]
async fn pause_and_resume_refuse_a_blank_or_padded_queue_name() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    for queue in ["", "  ", " mail"] {
        let err = refused(&dbworker(&db, &["pause", "--queue", queue]));
        assert!(err.contains("queue"), "{queue:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    for queue in ["", "  "] {
        let err = refused(&dbworker(&db, &["resume", "--queue", queue]));
        assert!(err.contains("--queue: name the queue"), "{queue:?}: {err}");
    }
    assert_eq!(pauses(&db).await, Vec::<String>::new());
    ok(&dbworker(&db, &["pause"]));
    let err = refused(&dbworker(&db, &["resume", "--queue", ""]));
    assert!(err.contains("--queue"), "{err}");
    assert_eq!(pauses(&db).await, ["*"], "the whole table stays paused");
    ok(&dbworker(&db, &["pause", "--queue", "mail"]));
    assert_eq!(pauses(&db).await, ["*", "mail"]);
}

/// `requeue --state queued` exited 0 having touched nothing ("no job to
/// requeue matches"), as if there were no queued job.
#[tokio::test]
async fn a_bulk_action_refuses_a_state_it_never_touches() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (state, queue) SELECT 'queued', 'mail' FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue) VALUES ('completed', 'mail'), ('failed', 'mail');",
    )
    .await;
    let states = "SELECT state::text FROM jobs ORDER BY id";
    let before: Vec<String> = sqlx::query_scalar(states)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    for (verb, state, allowed) in [
        ("requeue", "queued", "failed, canceled, errored"),
        ("requeue", "failed,queued", "failed, canceled, errored"),
        ("requeue", "stalled", "failed, canceled, errored"),
        ("fail", "completed", "queued, errored"),
        (
            "complete",
            "processing",
            "queued, errored, failed, canceled",
        ),
        ("delete", "processing", "pending, queued"),
        ("reschedule", "completed", "queued, errored"),
    ] {
        let err = refused(&dbworker(&db, &[verb, "--state", state, "--yes"]));
        assert!(
            err.contains(&format!("{verb} acts only on")) && err.contains(allowed),
            "{verb} --state {state}: {err}"
        );
        let named = if state == "stalled" {
            "processing"
        } else {
            state.rsplit(',').next().unwrap()
        };
        assert!(
            err.contains(&format!("not {named}")),
            "{verb} --state {state}: {err}"
        );
    }
    let after: Vec<String> = sqlx::query_scalar(states)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, before, "nothing was touched");
    // A state the action touches still works.
    let done = ok(&dbworker(&db, &["cancel", "--state", "queued", "--yes"]));
    assert!(done.contains("3 job(s)"), "{done}");
}

/// A duration flag past 100 years (the library's bound on every option's
/// time) is refused by name before anything runs: `purge --history-catch-up`
/// panicked adding it to the history's settle, `cron --interval` was
/// refused only as the library's `interval`, `top --interval` is added to
/// the clock at each wait.
#[tokio::test]
async fn a_duration_flag_past_100_years_is_refused_by_name() {
    let db = Db::new().await;
    let huge = "18446744073709551615s";
    for (args, flag) in [
        (
            &["purge", "--history", "--history-catch-up", huge, "--once"][..],
            "--history-catch-up",
        ),
        (&["purge", "--interval", huge, "--once"], "--interval"),
        (&["cron", "--interval", huge, "--once"], "--interval"),
        (
            &["reset", "--stalled-max-age", huge, "--once"],
            "--stalled-max-age",
        ),
        (&["top", "--interval", huge, "--once"], "--interval"),
        // As seconds too.
        (
            &["cron", "--interval", "3200000000", "--once"],
            "--interval",
        ),
    ] {
        let err = refused(&dbworker(&db, args));
        assert!(
            err.contains(flag) && err.contains("100 years"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
