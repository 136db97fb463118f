//! Workflows on the dashboard, against real Postgres through the router: the
//! workflows list (counts against SQL, the state filter, keyset pages, no
//! sequential scan), a workflow's page draws its tasks and edges with their states and keeps
//! the whole graph after the edges are satisfied (`upstream_ids`, recorded
//! by every way of adding a dependency), the jobs list filters by workflow
//! across pages, task names are escaped, and a table migrated before
//! `upstream_ids` was part of `--workflows` still draws what its edges hold.

use crate::common;
use crate::fixtures::router;

use std::collections::{BTreeMap, HashMap};

use axum::Router;
use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use dbworker::workflow::{
    EnqueuedWorkflow, Task, Workflow, WorkflowFilter, WorkflowListRequest, WorkflowState, Workflows,
};
use dbworker::{DbConditions, DbStore, Handling, JobTable, NewJob, ddl::workflows_sql};
use router::get;
use sqlx::PgPool;
use workerutil::Store;

use common::{Db, Job};

async fn set_up() -> (Db, Workflows) {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    let table = db.table_with(|t| t.workflows = true).await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    (db, workflows)
}

/// The dashboard over the test table; `workflows`: the table has them
/// (`workflows_sql`), so the dashboard shows them.
async fn app(db: &Db, page_size: u32, workflows: bool) -> (Router, Dashboard) {
    let table = db.table_with(|t| t.workflows = workflows).await;
    let mut o = DashboardOptions::new(vec![table]);
    o.page_size = page_size;
    let dashboard = Dashboard::new(&db.pool, o).await.unwrap();
    (dashboard.router(), dashboard)
}

/// fetch → (resize, scan) → publish; `scan` names the third task.
async fn diamond(workflows: &Workflows, scan: &str) -> EnqueuedWorkflow {
    workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("fetch", NewJob::new()))
                .task(Task::new("resize", NewJob::new()).after(["fetch"]))
                .task(Task::new(scan, NewJob::new()).after(["fetch"]))
                .task(Task::new("publish", NewJob::new()).after(["resize", scan])),
        )
        .await
        .unwrap()
}

/// Claims the next job (lowest id first).
async fn claim(store: &DbStore<Job>) -> dbworker::DbJob<Job> {
    let mut jobs = store
        .dequeue("test", &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "a job to claim");
    jobs.pop().unwrap()
}

/// Claims the next job and completes it; returns its id.
async fn run_one(store: &DbStore<Job>) -> i64 {
    let mut job = claim(store).await;
    assert!(store.mark_complete(&mut job).await.unwrap());
    job.record().id
}

/// `id="node-{id}"` with its state.
fn node(id: i64, state: &str) -> String {
    format!(r#"id="node-{id}" class="node" data-state="{state}""#)
}

fn edge(from: i64, to: i64) -> String {
    format!(r#"id="edge-{from}-{to}" class="edge" data-from="{from}" data-to="{to}""#)
}

fn count(page: &str, needle: &str) -> usize {
    page.matches(needle).count()
}

#[tokio::test]
async fn the_workflow_page_draws_a_diamond_and_keeps_it_once_run() {
    let (db, workflows) = set_up().await;
    let wf = diamond(&workflows, "scan").await;
    let id = |name: &str| wf.id_of(name).unwrap();
    let store = db.store(Handling::Heartbeat).await;
    let (app, _dashboard) = app(&db, 50, true).await;
    let url = format!("/t/jobs/workflows/{}", wf.id);

    // Part of it run: fetch completed, resize running, scan released.
    assert_eq!(run_one(&store).await, id("fetch"));
    let mut resize = claim(&store).await;
    assert_eq!(resize.record().id, id("resize"));
    let (status, page) = get(&app, &url).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("Workflow {}", wf.id)), "{page}");
    for (name, state) in [
        ("fetch", "completed"),
        ("resize", "processing"),
        ("scan", "queued"),
        ("publish", "pending"),
    ] {
        assert!(page.contains(&node(id(name), state)), "{name}: {page}");
        assert!(page.contains(&format!(r#"data-name="{name}""#)), "{page}");
        assert!(
            page.contains(&format!(r#"<td class="num" data-state="{state}">1</td>"#)),
            "count of {state}: {page}"
        );
    }
    assert_eq!(count(&page, r#"class="node""#), 4, "{page}");
    assert_eq!(count(&page, r#"class="edge""#), 4, "{page}");
    // Fetch's edges were deleted when it completed: drawn from upstream_ids.
    for (from, to) in [
        ("fetch", "resize"),
        ("fetch", "scan"),
        ("resize", "publish"),
        ("scan", "publish"),
    ] {
        assert!(page.contains(&edge(id(from), id(to))), "{from}→{to}");
    }
    assert!(page.contains(r#"data-nodes="4" data-edges="4""#), "{page}");
    assert!(!page.contains("edges-only"), "{page}");
    assert!(
        page.contains(&format!(r#"href="/t/jobs/jobs/{}""#, id("publish"))),
        "each node links to its job: {page}"
    );

    // The rest run: every edge is gone from the edge table, the graph stays.
    assert!(store.mark_complete(&mut resize).await.unwrap());
    assert_eq!(run_one(&store).await, id("scan"));
    assert_eq!(run_one(&store).await, id("publish"));
    let edges: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs_deps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(edges, 0, "satisfied edges are deleted");
    let (_, page) = get(&app, &url).await;
    for name in ["fetch", "resize", "scan", "publish"] {
        assert!(page.contains(&node(id(name), "completed")), "{page}");
    }
    assert!(
        page.contains(r#"<td class="num" data-state="completed">4</td>"#),
        "{page}"
    );
    assert_eq!(count(&page, r#"class="edge""#), 4, "{page}");
    assert!(page.contains(&edge(id("scan"), id("publish"))), "{page}");

    // Linked from a task's job page and from the list filtered by it.
    let link = format!(r#"id="workflow-link" href="/t/jobs/workflows/{}""#, wf.id);
    let (_, job_page) = get(&app, &format!("/t/jobs/jobs/{}", id("scan"))).await;
    assert!(job_page.contains(&link), "{job_page}");
    let (_, list) = get(&app, &format!("/t/jobs/jobs?workflow={}", wf.id)).await;
    assert!(list.contains(&link), "{list}");

    // A job outside any workflow has no link; an unknown workflow is a 404.
    let plain = db.enqueue(1, serde_json::json!({})).await[0];
    let (_, job_page) = get(&app, &format!("/t/jobs/jobs/{plain}")).await;
    assert!(!job_page.contains("workflow-link"), "{job_page}");
    let (status, _) = get(&app, "/t/jobs/workflows/987654").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_jobs_list_filters_by_workflow_across_pages() {
    let (db, workflows) = set_up().await;
    let a = diamond(&workflows, "scan").await;
    let b = diamond(&workflows, "scan").await;
    let plain = db.enqueue(2, serde_json::json!({})).await;
    let (router, _dashboard) = app(&db, 3, true).await;
    let job_link = |id: i64| format!(r#"href="/t/jobs/jobs/{id}""#);

    let (status, first) = get(&router, &format!("/t/jobs/jobs?workflow={}", a.id)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(
        first.contains(&format!(
            r#"name="workflow" placeholder="workflow id" size="10" value="{}""#,
            a.id
        )),
        "the filter form shows it: {first}"
    );
    let next = first
        .split(r#"<a href=""#)
        .find_map(|s| s.split_once(r#"">Next page"#).map(|(href, _)| href))
        .expect("a next page")
        .replace("&amp;", "&");
    assert!(next.contains(&format!("workflow={}", a.id)), "{next}");
    let (_, second) = get(&router, &format!("/t/jobs/jobs{next}")).await;
    let pages = format!("{first}{second}");
    for id in a.ids.values() {
        assert_eq!(count(&pages, &job_link(*id)), 1, "job {id} once: {pages}");
    }
    for id in b.ids.values().copied().chain(plain) {
        assert!(!pages.contains(&job_link(id)), "job {id} is not in it");
    }
    // Each row links to its workflow.
    assert_eq!(
        count(
            &first,
            &format!(r#"class="workflow" href="/t/jobs/workflows/{}""#, a.id)
        ),
        3,
        "{first}"
    );
    // Bulk actions carry it too.
    assert!(
        first.contains(&format!(r#"name="f_workflow" value="{}""#, a.id)),
        "{first}"
    );
    let (status, _) = get(&router, "/t/jobs/jobs?workflow=abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A table without workflows refuses the filter and has no workflow page.
    let other = Db::new().await;
    let (plain_app, _d) = app(&other, 50, false).await;
    let (status, page) = get(&plain_app, "/t/jobs/jobs?workflow=1").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (_, page) = get(&plain_app, "/t/jobs/jobs").await;
    assert!(!page.contains(r#"name="workflow""#), "{page}");
    let (status, _) = get(&plain_app, "/t/jobs/workflows/1").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn task_names_are_escaped_on_the_workflow_page() {
    let (db, workflows) = set_up().await;
    let hostile = r#"<script>alert("x")</script>"#;
    let wf = diamond(&workflows, hostile).await;
    let (app, _dashboard) = app(&db, 50, true).await;
    let (status, page) = get(&app, &format!("/t/jobs/workflows/{}", wf.id)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<script>"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(&quot;x&quot;)"),
        "{page}"
    );
    assert_eq!(count(&page, r#"class="node""#), 4, "{page}");
    assert_eq!(count(&page, r#"class="edge""#), 4, "{page}");
}

#[tokio::test]
async fn a_table_migrated_without_upstream_ids_draws_its_remaining_edges() {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    // As `--workflows` left a table before upstream_ids was part of it.
    db.execute("ALTER TABLE jobs DROP COLUMN upstream_ids")
        .await;
    let table = db.table_with(|t| t.workflows = true).await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let wf = diamond(&workflows, "scan").await;
    let id = |name: &str| wf.id_of(name).unwrap();
    let store = db.store(Handling::Transactional).await;
    assert_eq!(run_one(&store).await, id("fetch"));
    let (app, _dashboard) = app(&db, 50, true).await;
    let (status, page) = get(&app, &format!("/t/jobs/workflows/{}", wf.id)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(r#"id="edges-only""#), "it says so: {page}");
    assert!(page.contains(&node(id("fetch"), "completed")), "{page}");
    assert!(page.contains(&node(id("scan"), "queued")), "{page}");
    assert_eq!(count(&page, r#"class="node""#), 4, "{page}");
    // Fetch's edges were satisfied and deleted; publish's are still there.
    assert_eq!(count(&page, r#"class="edge""#), 2, "{page}");
    assert!(page.contains(&edge(id("resize"), id("publish"))), "{page}");
    assert!(page.contains(&edge(id("scan"), id("publish"))), "{page}");
}

#[tokio::test]
async fn every_way_of_adding_a_dependency_records_it() {
    let (db, workflows) = set_up().await;
    let upstream_ids =
        |id: i64| db.scalar::<Option<Vec<i64>>>("SELECT upstream_ids FROM jobs WHERE id = $1", id);
    // The builder, on a table without a result column.
    let wf = diamond(&workflows, "scan").await;
    let id = |name: &str| wf.id_of(name).unwrap();
    assert_eq!(
        upstream_ids(id("publish")).await,
        Some(vec![id("resize"), id("scan")])
    );
    assert_eq!(upstream_ids(id("fetch")).await, None);

    // NewJob::after.
    let after = workflows
        .enqueuer()
        .enqueue(&NewJob::new().after([id("publish"), id("fetch")]))
        .await
        .unwrap()
        .id();
    let mut recorded = upstream_ids(after).await.unwrap();
    recorded.sort_unstable();
    assert_eq!(recorded, vec![id("fetch"), id("publish")]);

    // <table>_wait_for, called twice on one job: the second call adds to
    // what the first recorded. The first upstream is done, so the job stays
    // queued and may wait again.
    let done = db.enqueue(1, serde_json::json!({})).await[0];
    db.execute(&format!(
        "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = {done}"
    ))
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    let job: i64 = sqlx::query_scalar("INSERT INTO jobs DEFAULT VALUES RETURNING id")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let states: Vec<String> = vec![
        sqlx::query_scalar("SELECT jobs_wait_for($1, ARRAY[$2]::bigint[])")
            .bind(job)
            .bind(done)
            .fetch_one(&mut *tx)
            .await
            .unwrap(),
        sqlx::query_scalar("SELECT jobs_wait_for($1, ARRAY[$2]::bigint[])")
            .bind(job)
            .bind(id("scan"))
            .fetch_one(&mut *tx)
            .await
            .unwrap(),
    ];
    tx.commit().await.unwrap();
    assert_eq!(states, ["queued", "pending"]);
    let mut expected = vec![done, id("scan")];
    expected.sort_unstable();
    assert_eq!(upstream_ids(job).await, Some(expected));

    // Running --results on the same table after --workflows changes nothing.
    db.add_columns(|c| c.results = true, &[]).await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    assert_eq!(
        upstream_ids(id("publish")).await,
        Some(vec![id("resize"), id("scan")])
    );
}

#[tokio::test]
async fn a_workflow_too_large_to_draw_shows_counts_and_a_table() {
    let (db, workflows) = set_up().await;
    let mut workflow = Workflow::new().task(Task::new("t0", NewJob::new()));
    for i in 1..=500 {
        workflow = workflow.task(Task::new(format!("t{i}"), NewJob::new()).after(["t0"]));
    }
    let wf = workflows.enqueue(&workflow).await.unwrap();
    let (app, _dashboard) = app(&db, 50, true).await;
    let (status, page) = get(&app, &format!("/t/jobs/workflows/{}", wf.id)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"id="not-drawn""#), "it says so: {page}");
    assert!(page.contains("This workflow has 501 tasks"), "{page}");
    assert!(!page.contains("workflow-graph"), "no drawing");
    assert!(
        page.contains(r#"<td class="num" data-state="pending">500</td>"#),
        "{page}"
    );
    assert!(page.contains(r#"<td class="num" data-state="queued">1</td>"#));
    let rows = count(&page, "<tr>") - 3; // two rows of counts, one header
    assert_eq!(rows, 500, "the first 500 tasks");
    assert!(page.contains(&format!(">{}</a>", wf.id_of("t499").unwrap())));
    assert!(!page.contains(&format!(">{}</a>", wf.id_of("t500").unwrap())));
}

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
