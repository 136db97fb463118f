//! The operators' pages of the dashboard, through the router against real
//! Postgres: the workflows list (counts against SQL, the state filter, keyset
//! pages, no sequential scan), limits edited by an admin and obeyed at the
//! next claim (refused to a reader), the job page in an operator's order,
//! the processes page (stale and dead heartbeats, the leader), and the
//! paused-refresh toggle.

mod common;
#[path = "common/router.rs"]
mod router;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE};
use dbworker::control::{DEFAULT_LIMIT_TABLE, Limits};
use dbworker::dashboard::{Auth, Dashboard, DashboardOptions};
use dbworker::ddl::{leader_table_sql, limit_table_sql, node_table_sql, workflows_sql};
use dbworker::workflow::{WorkflowFilter, WorkflowListRequest, WorkflowState, Workflows};
use dbworker::{DbConditions, JobTable};
use sqlx::PgPool;
use workerutil::Store;

use common::Db;
use router::{csrf, get, get_as, post};

/// 20,000 jobs outside any workflow, and seven workflows of three tasks:
/// 101 completed, 102 failed, 103 canceled, 104–107 running.
async fn seed_workflows() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[workflows_sql("jobs", &HashMap::new()).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, finished_at) SELECT 'completed', now() FROM generate_series(1, 20000);
         INSERT INTO jobs (state, workflow_id, task_name, queued_at, finished_at) VALUES
           ('completed', 101, 'a', now() - interval '3 hours', now()), ('completed', 101, 'b', now(), now()), ('completed', 101, 'c', now(), now()),
           ('completed', 102, 'a', now() - interval '2 hours', now()), ('failed', 102, 'b', now(), now()), ('canceled', 102, 'c', now(), now()),
           ('completed', 103, 'a', now(), now()), ('canceled', 103, 'b', now(), now()), ('canceled', 103, 'c', now(), now());
         INSERT INTO jobs (state, workflow_id, task_name) SELECT s, w, s FROM generate_series(104, 107) AS w,
           unnest(ARRAY['completed', 'processing', 'pending']) AS s;
         UPDATE jobs SET finished_at = NULL WHERE state IN ('processing', 'pending');
         ANALYZE jobs;",
    )
    .await;
    db
}

async fn seq_scans(pool: &PgPool) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Workflow `id`'s tasks per state, counted by SQL.
async fn counted(pool: &PgPool, id: i64) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT state::text, count(*) FROM jobs WHERE workflow_id = $1 GROUP BY 1",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The workflow ids on a list page, in order, and its "Next page" link.
fn rows(page: &str) -> (Vec<i64>, Option<String>) {
    let ids = page
        .split("<tr data-workflow=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].parse().unwrap())
        .collect();
    let needle = "id=\"next-page\" href=\"";
    let next = page.find(needle).map(|at| {
        let rest = &page[at + needle.len()..];
        rest[..rest.find('"').unwrap()].replace("&amp;", "&")
    });
    (ids, next)
}

/// Follows the list's pages from `query`; every workflow id in order.
async fn all_pages(app: &Router, query: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut next = Some(query.to_owned());
    while let Some(q) = next.take() {
        let (status, page) = get(app, &format!("/t/jobs/workflows{q}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let (more, link) = rows(&page);
        ids.extend(more);
        next = link;
        assert!(ids.len() < 100, "too many pages");
    }
    ids
}

#[tokio::test]
async fn the_workflows_list_counts_filters_and_pages_without_a_scan() {
    let db = seed_workflows().await;
    // One connection, so the statistics read are the pages' own.
    let pool = db.db.pool(1).await.unwrap();
    let mut o = Db::table_options();
    o.queue_column = Some("queue".into());
    o.workflows = true;
    let table = JobTable::new(&pool, o).await.unwrap();
    let mut options = DashboardOptions::new(vec![table.clone()]);
    options.page_size = 3;
    let dashboard = Dashboard::new(&pool, options).await.unwrap();
    let app = dashboard.router();

    let before = seq_scans(&pool).await;
    let (status, page) = get(&app, "/t/jobs/workflows").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("href=\"/t/jobs/workflows\">workflows</a>"),
        "in the nav: {page}"
    );
    // Every count shown is the table's own.
    let (ids, next) = rows(&page);
    assert_eq!(ids, [107, 106, 105]);
    assert_eq!(next.as_deref(), Some("?before=105"));
    for id in &ids {
        let row = &page[page.find(&format!("<tr data-workflow=\"{id}\"")).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(&format!("href=\"/t/jobs/workflows/{id}\"")),
            "{row}"
        );
        assert!(
            row.contains("<span class=\"workflow-running\">running</span>"),
            "{row}"
        );
        for (state, n) in counted(&pool, *id).await {
            assert!(
                row.contains(&format!("data-state=\"{state}\">{n}</td>")),
                "{state} {n}: {row}"
            );
        }
        assert!(row.contains("data-state=\"failed\">0</td>"), "{row}");
    }
    assert_eq!(
        all_pages(&app, "").await,
        [107, 106, 105, 104, 103, 102, 101]
    );
    assert_eq!(
        all_pages(&app, "?state=running").await,
        [107, 106, 105, 104]
    );
    assert_eq!(all_pages(&app, "?state=finished").await, [103, 102, 101]);
    assert_eq!(all_pages(&app, "?state=failed").await, [102]);
    assert_eq!(all_pages(&app, "?state=canceled").await, [103]);
    assert_eq!(all_pages(&app, "?state=completed").await, [101]);
    let (_, page) = get(&app, "/t/jobs/workflows?state=failed").await;
    let row = &page[page.find("<tr data-workflow=\"102\"").unwrap()..];
    assert!(
        row.contains("data-state=\"failed\">1</td>")
            && row.contains("data-state=\"canceled\">1</td>"),
        "{row}"
    );
    assert!(
        row.contains("<td>2h</td>"),
        "its age, from its first task: {row}"
    );
    assert_eq!(
        seq_scans(&pool).await,
        before,
        "no sequential scan of the job table"
    );
    sqlx::query("SELECT count(*) FROM jobs")
        .execute(&pool)
        .await
        .unwrap();
    assert!(seq_scans(&pool).await > before, "the counter sees a scan");

    // Bad parameters are refused, naming what is wrong.
    let (status, page) = get(&app, "/t/jobs/workflows?state=bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        page.starts_with("state: unknown workflow state \"bogus\""),
        "{page}"
    );
    let (status, page) = get(&app, "/t/jobs/workflows?before=x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.starts_with("before:"), "{page}");

    // A rare state on a big table: each page looks at a bounded number of
    // workflows and says where to go on from.
    let workflows = Workflows::new(&pool, &table).await.unwrap();
    let mut request =
        WorkflowListRequest::first(1, WorkflowFilter::State(WorkflowState::Completed));
    request.look_at_most = 2;
    let first = workflows.list(request).await.unwrap();
    assert!(first.workflows.is_empty() && first.cut_short, "{first:?}");
    assert_eq!((first.looked_at, first.next), (3, Some(105)));
    request.before = first.next;
    let second = workflows.list(request).await.unwrap();
    assert_eq!((second.looked_at, second.next), (3, Some(102)));
    request.before = second.next;
    let third = workflows.list(request).await.unwrap();
    assert_eq!(third.workflows.len(), 1);
    assert_eq!(third.workflows[0].id, 101);
    assert_eq!(third.workflows[0].total, 3);
    assert_eq!(third.next, None, "the oldest workflow: nothing below");

    // A table without workflows has no such page.
    let plain = Dashboard::new(&pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap()
        .router();
    let (status, _) = get(&plain, "/t/jobs/workflows").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_limit_edited_by_an_admin_holds_at_the_next_claim_and_readers_cannot_edit() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue) SELECT 'queued', 'reports' FROM generate_series(1, 10)",
    )
    .await;
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
        })
        .await;
    let mut o = DashboardOptions::new(vec![table.clone()]);
    o.auth = Auth::Bearer {
        admin: Some("admin-secret".into()),
        read_only: Some("read-secret".into()),
    };
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (admin, reader) = ("Bearer admin-secret", "Bearer read-secret");

    // The admin sees a form per queue and one for another queue; a reader
    // sees the limits and no form.
    let (_, page) = get_as(&app, "/t/jobs/queues", admin).await;
    assert_eq!(
        page.matches("action=\"/t/jobs/queues/limit\"").count(),
        2,
        "{page}"
    );
    let token = csrf(&page);
    let (_, page) = get_as(&app, "/t/jobs/queues", reader).await;
    assert!(
        !page.contains("/queues/limit") && !page.contains("method=\"post\""),
        "{page}"
    );
    let set = |max: &str| format!("csrf={token}&queue=reports&do=set&max_processing={max}");
    let (status, _, _) = post(&app, "/t/jobs/queues/limit", &set("2"), Some(reader)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a reader's post is refused");
    let (status, _, _) = post(
        &app,
        "/t/jobs/queues/limit",
        "queue=reports&do=set&max_processing=2",
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token, no change");
    let limits = Limits::new(&db.pool, &table).await.unwrap();
    assert!(limits.list().await.unwrap().is_empty());

    // Set by the admin: a worker's next claim takes no more than it.
    let (status, _, location) = post(&app, "/t/jobs/queues/limit", &set("2"), Some(admin)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        location.as_deref(),
        Some("/t/jobs/queues?done=limit+set+on+reports")
    );
    let store = db.store_on(&table, db.options()).await;
    let claim = |n| {
        let store = store.clone();
        async move {
            store
                .dequeue("limits-test", &DbConditions::new(), n)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(claim(10).await, 2, "the limit of 2 holds at once");
    assert_eq!(claim(10).await, 0);
    let (_, page) = get_as(&app, "/t/jobs/queues?done=limit+set+on+reports", admin).await;
    assert!(
        page.contains("at most 2 processing") && page.contains("Done: limit set on reports"),
        "{page}"
    );
    assert!(page.contains("name=\"max_processing\" min=\"0\""), "{page}");

    // Changed: one more; removed: the rest.
    post(&app, "/t/jobs/queues/limit", &set("3"), Some(admin)).await;
    assert_eq!(claim(10).await, 1);
    let (status, _, location) = post(
        &app,
        "/t/jobs/queues/limit",
        &format!("csrf={token}&queue=reports&do=remove"),
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().contains("limit+removed"));
    assert!(limits.list().await.unwrap().is_empty());
    assert_eq!(claim(10).await, 7);

    // Bad input names its field and changes nothing.
    for (form, field) in [
        ("max_processing=two", "max_processing"),
        ("rate_per_second=-1", "rate_per_second"),
        ("burst=5", "burst"),
        ("max_per_key=1", "max_per_key"),
    ] {
        let (status, body, _) = post(
            &app,
            "/t/jobs/queues/limit",
            &format!("csrf={token}&queue=reports&do=set&{form}"),
            Some(admin),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form}: {body}");
        assert!(body.starts_with(&format!("{field}:")), "{form}: {body}");
    }
    assert!(limits.list().await.unwrap().is_empty());
    // A rate with its burst, on a queue with no job yet.
    post(
        &app,
        "/t/jobs/queues/limit",
        &format!("csrf={token}&queue=emails&do=set&rate_per_second=2.5&burst=5"),
        Some(admin),
    )
    .await;
    let (_, page) = get_as(&app, "/t/jobs/queues", reader).await;
    assert!(
        page.contains("<td>emails</td>") && page.contains("2.5/s (burst 5)"),
        "{page}"
    );
}

#[tokio::test]
async fn the_job_page_reads_in_an_operators_order() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
            c.max_retries = true;
            c.error_history = true;
            c.results = true;
        },
        &[],
    )
    .await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, queue, kind, num_failures, max_retries, failure_message, queued_at, started_at, finished_at, payload, result, errors, execution_logs)
         VALUES ('failed', 'mail', 'send', 2, 3, 'SMTP 550', now() - interval '3 minutes', now() - interval '2 minutes', now() - interval '90 seconds',
                 '{\"customer\": {\"id\": 42}}', '{\"sent\": false}',
                 jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now() - interval '150 seconds', 'worker', 'host-1', 'message', 'timeout')),
                 ARRAY[json_build_object('key', 'step', 'out', 'ran 1 of 2')])
         RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.max_retries_column = Some("max_retries".into());
            t.error_history_column = Some("errors".into());
            t.result_column = Some("result".into());
            t.payload_column = Some("payload".into());
        })
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in {page}"))
    };
    // What it is, when, what went wrong, what it was given and gave, its
    // logs, then the rest.
    let order = [
        "<th>state</th>",
        "<th>kind</th><td>send</td>",
        "<th>queue</th><td>mail</td>",
        "<th>attempts</th>",
        "<h2>Times</h2>",
        "<h2>Errors</h2>",
        "<h2>Payload</h2>",
        "<h2>Result</h2>",
        "<h2>Execution logs</h2>",
        "<h2>Other columns</h2>",
    ];
    for pair in order.windows(2) {
        assert!(at(pair[0]) < at(pair[1]), "{} before {}", pair[0], pair[1]);
    }
    assert!(page.contains("2/3 failures"), "attempts: {page}");
    assert!(
        page.contains("<th>queued</th><td><span class=\"when\""),
        "{page}"
    );
    // Queued 3 minutes ago, started 2, finished 90 s (rounded: 2m).
    assert!(
        page.contains(">3m ago</span>") && page.contains(">2m ago</span>"),
        "relative times: {page}"
    );
    assert!(page.contains(" UTC)</span>"), "absolute times: {page}");
    assert!(
        page.contains("SMTP 550") && page.contains("timeout") && page.contains("host-1"),
        "{page}"
    );
    assert!(
        page.contains("{\n  &quot;customer&quot;: {\n    &quot;id&quot;: 42\n  }\n}"),
        "indented payload: {page}"
    );
    assert!(
        page.contains("{\n  &quot;sent&quot;: false\n}"),
        "indented result: {page}"
    );
    assert!(page.contains("ran 1 of 2"), "{page}");
    // The rest after: the columns the sections did not show, once each.
    let rest = &page[at("<h2>Other columns</h2>")..];
    assert!(rest.contains("<th>cancel</th>"), "{rest}");
    assert!(
        !rest.contains("<th>payload</th>") && !rest.contains("<th>state</th>"),
        "{rest}"
    );
}

#[tokio::test]
async fn the_processes_page_flags_stale_and_dead_heartbeats_and_names_the_leader() {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}",
        node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap()
    ))
    .await;
    db.execute(
        "INSERT INTO dbworker_nodes (id, host, pid, version, queues, handlers, heartbeat_at) VALUES
           ('a:1:x', 'a', 1, '0.1.0', ARRAY['mail'], 8, now() - interval '1 second'),
           ('b:2:y', 'b', 2, '0.1.0', ARRAY['mail'], 8, now() - interval '7 seconds'),
           ('c:3:z', 'c', 3, '0.1.0', ARRAY['mail'], 8, now() - interval '60 seconds');
         INSERT INTO dbworker_leaders (scope, node_id, term, acquired_at, expires_at) VALUES
           ('jobs', 'a:1:x', 4, now(), now() + interval '6 seconds'),
           ('purger', 'c:3:z', 2, now() - interval '1 minute', now() - interval '50 seconds');",
    )
    .await;
    let mut o = DashboardOptions::new(vec![db.table().await]);
    o.node_table = Some(DEFAULT_NODE_TABLE.into());
    o.leader_table = Some(DEFAULT_LEADER_TABLE.into());
    o.dead_after = Duration::from_secs(10);
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (status, page) = get(&app, "/processes").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("href=\"/processes\">processes</a>"),
        "in the nav: {page}"
    );
    let row = |id: &str| {
        let r = &page[page.find(&format!("<td>{id}</td>")).unwrap()..];
        r[..r.find("</tr>").unwrap()].to_owned()
    };
    assert!(
        row("a:1:x").contains("health-live")
            && row("a:1:x").contains("<strong>leader</strong> of jobs"),
        "{page}"
    );
    assert!(row("b:2:y").contains("health-stale"), "{page}");
    assert!(
        row("c:3:z").contains("health-dead") && !row("c:3:z").contains("leader"),
        "{page}"
    );
    assert!(
        page.contains("<strong id=\"live-count\">2</strong> live of 3"),
        "{page}"
    );
    assert!(page.contains("<td>purger</td><td>c:3:z</td><td class=\"num\">2</td><td><span class=\"muted\">expired: no leader</span>"), "{page}");

    // Without the registry there is no such page (and no link to it).
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap()
        .router();
    let (status, _) = get(&app, "/processes").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, page) = get(&app, "/").await;
    assert!(!page.contains("processes</a>"), "{page}");
}

#[tokio::test]
async fn auto_refresh_pauses_and_resumes_by_links_and_links_keep_it() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (_, page) = get(&app, "/t/jobs/jobs?state=failed").await;
    assert!(!page.contains("http-equiv=\"refresh\""), "off by default");
    assert!(page.contains("data-refresh=\"off\""), "{page}");
    assert!(
        page.contains("href=\"?state=failed&amp;refresh=5\""),
        "{page}"
    );

    let (_, page) = get(&app, "/t/jobs/jobs?state=failed&refresh=5").await;
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"5\">"),
        "{page}"
    );
    assert!(
        page.contains("data-refresh=\"on\"") && page.contains("<strong>every 5 s</strong>"),
        "{page}"
    );
    assert!(
        page.contains("id=\"refresh-pause\" href=\"?state=failed&amp;paused=5\""),
        "{page}"
    );
    assert!(
        page.contains("href=\"/t/jobs/queues?refresh=5\""),
        "the nav keeps it: {page}"
    );

    let (_, page) = get(&app, "/t/jobs/jobs?state=failed&paused=5").await;
    assert!(!page.contains("http-equiv=\"refresh\""), "paused: {page}");
    assert!(
        page.contains("data-refresh=\"paused\"") && page.contains("<strong>paused</strong>"),
        "{page}"
    );
    assert!(
        page.contains("id=\"refresh-resume\" href=\"?state=failed&amp;refresh=5\""),
        "{page}"
    );
    assert!(
        page.contains("href=\"/t/jobs/queues?paused=5\""),
        "the nav keeps it paused: {page}"
    );
}
