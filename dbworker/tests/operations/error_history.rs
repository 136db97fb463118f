//! The per-attempt error history on Postgres: every failing mark (errored,
//! with the store's or a kind's retry rule; failed; a reset; a requeue after
//! a lost connection) appends `{attempt, at, message, worker}` in its own
//! fenced statement, in both handling modes; the cap holds; a stale mark
//! appends nothing.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use dbworker::{DbJob, DbStore, Handling, JobTable, JobTableOptions, Retry};
use serde_json::{Value, json};
use workerutil::Store;

use common::{Db, Job};

async fn with_history(db: &Db) {
    db.add_columns(|c| c.error_history = true, &[]).await;
}

/// `table` (`jobs`, with or without an alias) with its error history in `errors`.
fn history_table_options(table: &str) -> JobTableOptions {
    let mut t = JobTableOptions::new(table);
    t.error_history_column = Some("errors".into());
    t
}

async fn store(db: &Db, handling: Handling, limit: u32) -> Arc<DbStore<Job>> {
    let mut t = history_table_options("jobs j");
    t.error_history_limit = limit;
    let table = JobTable::new(&db.pool, t).await.expect("job table");
    let mut o = db.options();
    o.handling = handling;
    o.max_num_retries = 5;
    db.store_on(&table, o).await
}

async fn history(db: &Db, id: i64) -> Vec<Value> {
    let v: Option<Value> = db.scalar("SELECT errors FROM jobs WHERE id = $1", id).await;
    v.map(|v| v.as_array().unwrap().clone()).unwrap_or_default()
}

/// Claims the one job as `worker` and opens it (its transaction, in
/// transactional handling), as the worker loop would.
async fn claim(store: &DbStore<Job>, worker: &str) -> DbJob<Job> {
    let mut jobs = store.dequeue(worker, &Default::default(), 1).await.unwrap();
    assert_eq!(jobs.len(), 1, "{worker} claims the job");
    let mut job = jobs.pop().unwrap();
    assert!(store.open(&mut job).await.unwrap());
    job
}

/// Makes an errored job due now.
async fn due(db: &Db) {
    db.execute("UPDATE jobs SET process_after = NULL").await;
}

fn field<'a>(entries: &'a [Value], key: &str) -> Vec<&'a Value> {
    entries.iter().map(|e| &e[key]).collect()
}

#[tokio::test]
async fn three_failing_attempts_leave_three_entries_in_order() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        with_history(&db).await;
        let id = db.enqueue(1, json!({})).await[0];
        let store = store(&db, handling, 20).await;

        let mut job = claim(&store, "worker-1").await;
        assert!(
            store
                .mark_errored(&mut job, "first", None)
                .await
                .unwrap()
                .is_some()
        );
        due(&db).await;
        // A kind's own retry rule: the override path writes the entry too.
        let mut job = claim(&store, "worker-2").await;
        let kind_rule = Retry::new().max_retries(4);
        assert!(
            store
                .mark_errored(&mut job, "second", Some(&kind_rule))
                .await
                .unwrap()
                .is_some()
        );
        due(&db).await;
        let mut job = claim(&store, "worker-3").await;
        assert!(store.mark_failed(&mut job, "third, final").await.unwrap());
        assert_eq!(db.state(id).await, "failed", "{handling:?}");

        let entries = history(&db, id).await;
        assert_eq!(entries.len(), 3, "{handling:?}: {entries:?}");
        assert_eq!(
            field(&entries, "attempt"),
            [&json!(1), &json!(2), &json!(3)]
        );
        assert_eq!(
            field(&entries, "message"),
            [&json!("first"), &json!("second"), &json!("third, final")]
        );
        assert_eq!(
            field(&entries, "worker"),
            [&json!("worker-1"), &json!("worker-2"), &json!("worker-3")]
        );
        // `at` is the database's clock, in order, the last one at the final mark.
        let in_order: bool = db
            .scalar(
                "SELECT (errors->0->>'at')::timestamptz <= (errors->1->>'at')::timestamptz
                    AND (errors->1->>'at')::timestamptz <= (errors->2->>'at')::timestamptz
                    AND abs(EXTRACT(EPOCH FROM (errors->2->>'at')::timestamptz - finished_at)) < 1
                   FROM jobs WHERE id = $1",
                id,
            )
            .await;
        assert!(in_order, "{handling:?}: {entries:?}");
    }
}

#[tokio::test]
async fn the_history_keeps_only_the_last_entries() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        with_history(&db).await;
        let id = db.enqueue(1, json!({})).await[0];
        let store = store(&db, handling, 2).await;
        for attempt in 1..=4 {
            let mut job = claim(&store, &format!("w{attempt}")).await;
            let message = format!("failure {attempt}");
            assert!(
                store
                    .mark_errored(&mut job, &message, None)
                    .await
                    .unwrap()
                    .is_some()
            );
            due(&db).await;
        }
        let entries = history(&db, id).await;
        assert_eq!(
            field(&entries, "attempt"),
            [&json!(3), &json!(4)],
            "{handling:?}"
        );
        assert_eq!(
            field(&entries, "message"),
            [&json!("failure 3"), &json!("failure 4")]
        );
    }
}

#[tokio::test]
async fn a_stale_mark_appends_nothing_and_resets_append_their_own_entry() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        with_history(&db).await;
        let id = db.enqueue(1, json!({})).await[0];
        let store = store(&db, handling, 20).await;
        // Heartbeat handling: no transaction locks the row, so it can stall.
        let mut stale = store.dequeue("old", &Default::default(), 1).await.unwrap();
        db.age_heartbeats().await;
        let out = store.reset_stalled().await.unwrap();
        assert_eq!(out.reset.len(), 1, "{handling:?}");
        let mut fresh = claim(&store, "new").await;

        assert!(
            store
                .mark_errored(&mut stale[0], "stale", None)
                .await
                .unwrap()
                .is_none(),
            "{handling:?}: the stale mark is refused"
        );
        let entries = history(&db, id).await;
        assert_eq!(
            entries.len(),
            1,
            "{handling:?}: only the reset: {entries:?}"
        );
        assert_eq!(entries[0]["attempt"], json!(1));
        assert_eq!(entries[0]["worker"], json!("old"));
        assert!(
            entries[0]["message"].as_str().unwrap().contains("reset"),
            "{entries:?}"
        );

        assert!(
            store
                .mark_errored(&mut fresh, "real", None)
                .await
                .unwrap()
                .is_some()
        );
        let entries = history(&db, id).await;
        assert_eq!(field(&entries, "attempt"), [&json!(1), &json!(2)]);
        assert_eq!(entries[1]["worker"], json!("new"));
        assert_eq!(entries[1]["message"], json!("real"));
    }
}

#[tokio::test]
async fn a_reset_past_its_budget_records_the_failure() {
    let db = Db::new().await;
    with_history(&db).await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    o.stall.max_num_resets = 0;
    o.stall.reset_failure_message = "died too often".into();
    let table = JobTable::new(&db.pool, history_table_options("jobs j"))
        .await
        .unwrap();
    let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
    let _claimed = store.dequeue("w", &Default::default(), 1).await.unwrap();
    db.age_heartbeats().await;
    assert_eq!(store.reset_stalled().await.unwrap().failed, vec![id]);
    let entries = history(&db, id).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["message"], json!("died too often"));
    assert_eq!(entries[0]["worker"], json!("w"));
}

#[tokio::test]
async fn a_lost_connection_requeue_appends_an_entry() {
    let db = Db::new().await;
    with_history(&db).await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Transactional, 20).await;
    let mut job = claim(&store, "w").await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(job.tx().unwrap())
        .await
        .unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(killed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The mark says what it wrote: the job went back to the queue.
    assert_eq!(
        store.mark_errored(&mut job, "boom", None).await.unwrap(),
        Some(workerutil::JobState::Queued)
    );
    assert_eq!(db.state(id).await, "queued", "requeued, not errored");
    let entries = history(&db, id).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["worker"], json!("w"));
    assert!(
        entries[0]["message"]
            .as_str()
            .unwrap()
            .contains("connection was lost"),
        "{entries:?}"
    );
}

#[tokio::test]
async fn a_missing_history_column_is_named_at_start_up() {
    let db = Db::new().await;
    let err = JobTable::new(&db.pool, history_table_options("jobs j"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no column errors (error_history_column)") && err.contains("--error-history"),
        "{err}"
    );
    let mut t = Db::table_options();
    t.error_history_column = Some("cost".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(err.contains("has type int4, expected jsonb"), "{err}");
}

#[tokio::test]
async fn completions_leave_the_history_alone() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = Db::new().await;
        with_history(&db).await;
        let id = db.enqueue(1, json!({})).await[0];
        let store = store(&db, handling, 20).await;
        let mut job = claim(&store, "w").await;
        assert!(
            store
                .mark_errored(&mut job, "once", None)
                .await
                .unwrap()
                .is_some()
        );
        due(&db).await;
        let mut job = claim(&store, "w").await;
        assert!(store.mark_complete(&mut job).await.unwrap());
        assert_eq!(db.state(id).await, "completed");
        assert_eq!(history(&db, id).await.len(), 1, "{handling:?}");
    }
}

#[tokio::test]
async fn the_dashboards_job_page_lists_the_entries() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use dbworker::dashboard::{Dashboard, DashboardOptions};
    use tower::ServiceExt;

    let db = Db::new().await;
    with_history(&db).await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Transactional, 20).await;
    for (worker, message) in [
        ("host-a", "timeout <talking to api>"),
        ("host-b", "refused"),
    ] {
        let mut job = claim(&store, worker).await;
        assert!(
            store
                .mark_errored(&mut job, message, None)
                .await
                .unwrap()
                .is_some()
        );
        due(&db).await;
    }
    let table = JobTable::new(&db.pool, history_table_options("jobs"))
        .await
        .unwrap();
    let dashboard = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap();
    let res = dashboard
        .router()
        .oneshot(
            Request::get(format!("/t/jobs/jobs/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&body);
    let section = &page[page.find("Error history").expect("the section")..];
    let section = &section[..section.find("</table>").expect("its table")];
    let rows: Vec<&str> = section.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "{section}");
    for (row, (attempt, worker, message)) in rows.iter().zip([
        ("1", "host-a", "timeout &lt;talking to api&gt;"),
        ("2", "host-b", "refused"),
    ]) {
        assert!(
            row.starts_with(&format!("<td>{attempt}</td>"))
                && row.contains(&format!("<td>{worker}</td>"))
                && row.contains(message),
            "{row}"
        );
    }
}

/// The queries of dbworker/docs/operations.md, "A job's attempts (error history)".
#[tokio::test]
async fn the_operations_queries_read_the_history() {
    const OPERATIONS: &str = include_str!("../../docs/operations.md");
    let section = OPERATIONS
        .split("### A job's attempts (error history)")
        .nth(1)
        .expect("the section")
        .split("\n### ")
        .next()
        .unwrap();
    let queries: Vec<&str> = section
        .split("```sql\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(queries.len(), 2);

    let db = Db::new().await;
    with_history(&db).await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Heartbeat, 20).await;
    for worker in ["host-a", "host-b"] {
        let mut job = claim(&store, worker).await;
        assert!(
            store
                .mark_errored(&mut job, "nope", None)
                .await
                .unwrap()
                .is_some()
        );
        due(&db).await;
    }
    let sql = |q: &str| {
        q.replace("example_jobs", "jobs")
            .replace("id = 42", &format!("id = {id}"))
    };
    // (sqlx here decodes no timestamps: `at` comes back as text.)
    let first = format!(
        "SELECT attempt, at::text, worker, message FROM ({}) AS q",
        sql(queries[0]).trim().trim_end_matches(';')
    );
    let attempts: Vec<(i32, String, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(first))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let seen: Vec<(i32, &str)> = attempts
        .iter()
        .map(|(n, _, w, _)| (*n, w.as_str()))
        .collect();
    assert_eq!(seen, [(1, "host-a"), (2, "host-b")]);
    let spread: Vec<(i64, String, i64, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(sql(queries[1])))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(spread, [(id, "errored".to_owned(), 2, 2)]);
}

#[tokio::test]
async fn a_separate_resetter_appends_and_checks_the_column() {
    use dbworker::ResetterOptions;

    let db = Db::new().await;
    // The resetter's error history is its table's: checked by `JobTable::new`.
    let err = JobTable::new(&db.pool, history_table_options("jobs"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no column errors (error_history_column)"),
        "{err}"
    );

    with_history(&db).await;
    let id = db.enqueue(1, json!({})).await[0];
    let store = store(&db, Handling::Heartbeat, 20).await;
    let _claimed = store.dequeue("gone", &Default::default(), 1).await.unwrap();
    db.age_heartbeats().await;
    let table = JobTable::new(&db.pool, history_table_options("jobs"))
        .await
        .unwrap();
    let resetter = dbworker::Resetter::new(&db.pool, &table, ResetterOptions::new("resetter"))
        .await
        .unwrap();
    resetter.check().await.unwrap();
    assert_eq!(resetter.reset_once().await.unwrap().reset.len(), 1);
    let entries = history(&db, id).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["worker"], json!("gone"));
    assert_eq!(entries[0]["attempt"], json!(1));
}
