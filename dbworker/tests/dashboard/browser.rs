//! The dashboard in a real headless Chromium (through chromedriver): load the
//! overview, filter jobs by a payload field, open a job and retry it, pause a
//! queue and see workers stop claiming from it, and check that a read-only
//! user has no actions; follow a task to its workflow's graph; on a table
//! with rows in every state, check every count the overview, the workflows
//! list and the processes page show against SQL, edit a limit, read a job
//! page, pause and resume the refresh. Screenshots of each page go to
//! `target/dashboard-screenshots/` (`UPDATE_SCREENSHOTS=1`: docs/dashboard/). Skips, saying why, when Chromium or
//! chromedriver is missing (`.ci/run` installs them).

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE};
use dbworker::control::DEFAULT_LIMIT_TABLE;
use dbworker::dashboard::{Auth, Dashboard, DashboardOptions, Role, User};
use dbworker::ddl::{leader_table_sql, limit_table_sql, node_table_sql};
use dbworker::workflow::{Task, Workflow, Workflows};
use dbworker::{
    DbConditions, Handling, NewJob, control::DEFAULT_PAUSE_TABLE, ddl::pause_table_sql,
    ddl::workflows_sql,
};
use fantoccini::{Client, ClientBuilder, Locator};
use workerutil::Store;

use common::Db;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver, killed on drop.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn browser() -> Option<(Driver, Client)> {
    for needed in [CHROMIUM, CHROMEDRIVER] {
        if !std::path::Path::new(needed).exists() {
            dbworker_testkit::skip(
                "the browser test",
                &format!("{needed} is not installed (apt-get install chromium chromium-driver)"),
            );
            return None;
        }
    }
    let port = free_port();
    let driver = Driver(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"],
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => return Some((driver, client)),
            Err(err) if Instant::now() > deadline => panic!("chromedriver did not start: {err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Where screenshots go: `target/dashboard-screenshots/`, or with
/// `UPDATE_SCREENSHOTS=1` the pictures docs/dashboard.md shows.
fn screenshots() -> PathBuf {
    let dir = if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard")
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots")
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// The page's text once it contains `needle`: a click navigates on its own
/// time, so the old page (or a node of it) may still be there at first.
async fn page_with(c: &Client, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = String::new();
    loop {
        if let Ok(body) = c.find(Locator::Css("body")).await
            && let Ok(text) = body.text().await
        {
            if text.contains(needle) {
                return text;
            }
            last = text;
        }
        assert!(
            Instant::now() < deadline,
            "no page with {needle:?}; last:\n{last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `at` finds.
async fn click(c: &Client, at: Locator<'_>) {
    c.find(at).await.unwrap().click().await.unwrap();
}

/// Waits until the browser's address contains `part`.
async fn at_url(c: &Client, part: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.current_url().await.unwrap().as_str().contains(part) {
        assert!(
            Instant::now() < deadline,
            "never reached a URL with {part:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves the dashboard on a free port; the user comes from a `user` cookie
/// (the embedding application's own auth, through the hook). `workflows`:
/// the table has them (`workflows_sql`), so the dashboard shows them.
async fn serve(db: &Db, workflows: bool) -> (String, Dashboard) {
    let t = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
            t.workflows = workflows;
        })
        .await;
    serve_table(db, t, |_| {}).await
}

/// [`serve`] over `t`, with what `set` changes in the options.
async fn serve_table(
    db: &Db,
    t: dbworker::JobTable,
    set: impl FnOnce(&mut DashboardOptions),
) -> (String, Dashboard) {
    let mut o = DashboardOptions::new(vec![t]);
    set(&mut o);
    o.auth = Auth::Hook(Arc::new(|parts| {
        let cookies = parts.headers.get("cookie")?.to_str().ok()?;
        match cookies.split("; ").find_map(|c| c.strip_prefix("user="))? {
            "admin" => Some(User::new("alice", Role::Admin)),
            "reader" => Some(User::new("bob", Role::ReadOnly)),
            _ => None,
        }
    }));
    let dashboard = Dashboard::new(&db.pool, o).await.unwrap();
    // The application's own sign-in sets the cookie its hook reads.
    let app = axum::Router::new()
        .route(
            "/login/{who}",
            axum::routing::get(
                |axum::extract::Path(who): axum::extract::Path<String>| async move {
                    (
                        [(
                            axum::http::header::SET_COOKIE,
                            format!("user={who}; Path=/; HttpOnly; SameSite=Strict"),
                        )],
                        "signed in",
                    )
                },
            ),
        )
        .nest("/admin/jobs", dashboard.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!(
        "http://localhost:{}/admin/jobs",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, dashboard)
}

async fn sign_in(c: &Client, base: &str, who: &str) {
    let root = base.trim_end_matches("/admin/jobs");
    c.goto(&format!("{root}/login/{who}")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_use_the_dashboard_in_a_real_browser() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = Db::new().await;
    db.add_columns(
        |col| {
            col.queue = true;
            col.kind = true;
            col.retention = true;
        },
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            dbworker::ddl::history_table_sql(dbworker::history::DEFAULT_HISTORY_TABLE).unwrap(),
        ],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue, kind, finished_at, started_at, queued_at)
           SELECT CASE WHEN i % 29 = 0 THEN 'failed' ELSE 'completed' END, 'mail', 'send', f, f - (1 + i % 5) * interval '1 second', f - (3 + i % 11) * interval '1 second'
           FROM generate_series(1, 3000) AS i, LATERAL (SELECT now() - interval '2 minutes' - (i * 7 % 3600) * interval '1 second' AS f) AS t;
         INSERT INTO jobs (state, queue, kind, payload) SELECT 'queued', CASE WHEN i % 2 = 0 THEN 'mail' ELSE 'reports' END, 'send', jsonb_build_object('customer_id', i::text) FROM generate_series(1, 40) AS i;
         INSERT INTO jobs (state, queue, kind, num_failures, failure_message, finished_at, payload)
           VALUES ('failed', 'mail', 'send', 3, 'SMTP 550: mailbox unavailable', now(), '{\"customer_id\": \"4242\"}');
         INSERT INTO jobs (state, queue, kind, finished_at) SELECT 'completed', 'mail', 'send', now() FROM generate_series(1, 25);",
    )
    .await;
    let history_of = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    dbworker::history::History::new(&db.pool, &history_of, Default::default())
        .await
        .unwrap()
        .record_once()
        .await
        .unwrap();
    let (base, _dashboard) = serve(&db, false).await;
    sign_in(&c, &base, "admin").await;

    // Overview, with the history's charts.
    c.goto(&base).await.unwrap();
    let page = page_with(&c, "Oldest waiting job").await;
    assert!(page.contains("Finished jobs per minute"), "{page}");
    assert!(page.contains("alice · admin"), "{page}");
    let background = c
        .execute(
            "return getComputedStyle(document.body).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(background, "rgb(246, 247, 249)", "the stylesheet applies");
    shot(&c, "overview").await;

    // Filter by a payload field.
    c.goto(&format!("{base}/t/jobs/jobs")).await.unwrap();
    c.find(Locator::Css("input[name=field]"))
        .await
        .unwrap()
        .send_keys("payload.customer_id=4242")
        .await
        .unwrap();
    click(&c, Locator::Css("form.filters:not(.goto) button")).await;
    at_url(&c, "field=payload").await;
    page_with(&c, "SMTP 550: mailbox unavailable").await;
    let rows = c
        .find_all(Locator::Css("input[type=checkbox]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "only the matching job");
    shot(&c, "jobs").await;

    // Open the job and retry it.
    click(&c, Locator::Css("table a")).await;
    page_with(&c, "State: failed").await;
    shot(&c, "job").await;
    click(&c, Locator::XPath("//button[text()='Retry now']")).await;
    let page = page_with(&c, "Done: requeue").await;
    assert!(page.contains("State: queued"), "{page}");
    let state: String =
        sqlx::query_scalar("SELECT state FROM jobs WHERE payload->>'customer_id' = '4242'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(state, "queued");

    // Pause the mail queue: a worker's claim skips it from then on.
    c.goto(&format!("{base}/t/jobs/queues")).await.unwrap();
    click(
        &c,
        Locator::XPath("//tr[td[text()='mail']]//button[text()='Pause']"),
    )
    .await;
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath(
            "//tr[td[text()='mail']]//strong[text()='paused']",
        ))
        .await
        .expect("the mail queue shows paused");
    shot(&c, "queues").await;
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        })
        .await;
    let store = db.store_on(&table, so).await;
    let claimed = store
        .dequeue("browser-test", &DbConditions::new(), 100)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 20, "only the reports queue");
    let mail_claimed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE state = 'processing' AND queue = 'mail'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        mail_claimed, 0,
        "workers stop claiming from the paused queue"
    );

    // Resume it from the same page.
    click(
        &c,
        Locator::XPath("//tr[td[text()='mail']]//button[text()='Resume']"),
    )
    .await;
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath(
            "//tr[td[text()='mail']]//button[text()='Pause']",
        ))
        .await
        .expect("the mail queue runs again");
    let pauses: i64 = sqlx::query_scalar("SELECT count(*) FROM dbworker_pauses")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pauses, 0);

    // Bulk: cancel two selected jobs, through the confirmation page.
    c.goto(&format!("{base}/t/jobs/jobs?state=queued&queue=mail"))
        .await
        .unwrap();
    let boxes = c
        .find_all(Locator::Css("input[type=checkbox]"))
        .await
        .unwrap();
    let mut chosen = Vec::new();
    for b in boxes.iter().take(2) {
        chosen.push(
            b.attr("value")
                .await
                .unwrap()
                .unwrap()
                .parse::<i64>()
                .unwrap(),
        );
        b.click().await.unwrap();
    }
    c.find(Locator::Css("select[name=action]"))
        .await
        .unwrap()
        .select_by_value("cancel")
        .await
        .unwrap();
    click(&c, Locator::Css("button[value=selected]")).await;
    page_with(&c, "cancel 2 job(s) — the selected jobs").await;
    shot(&c, "confirm").await;
    c.find(Locator::XPath(
        "//button[starts-with(text(), 'Yes, cancel 2')]",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    page_with(&c, "Done: cancel 2").await;
    for id in &chosen {
        assert_eq!(db.state(*id).await, "canceled");
    }

    // Fail one job from its page.
    let one: i64 =
        sqlx::query_scalar("SELECT min(id) FROM jobs WHERE state = 'queued' AND queue = 'mail'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    c.goto(&format!("{base}/t/jobs/jobs/{one}")).await.unwrap();
    click(&c, Locator::XPath("//button[text()='Fail']")).await;
    page_with(&c, "Done: fail").await;
    assert_eq!(db.state(one).await, "failed");

    // A read-only user sees everything and can act on nothing.
    sign_in(&c, &base, "reader").await;
    c.goto(&format!("{base}/t/jobs/queues")).await.unwrap();
    let page = page_with(&c, "bob · read-only").await;
    assert!(page.contains("bob · read-only"), "{page}");
    assert!(
        c.find_all(Locator::Css("button")).await.unwrap().is_empty(),
        "{page}"
    );
    c.goto(&format!("{base}/t/jobs/jobs")).await.unwrap();
    assert!(
        c.find_all(Locator::Css("form[method=post]"))
            .await
            .unwrap()
            .len()
            == 1
    );
    assert!(
        c.find_all(Locator::Css("input[type=checkbox]"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        c.find_all(Locator::Css("button[name=scope]"))
            .await
            .unwrap()
            .is_empty()
    );
    shot(&c, "read-only").await;
    c.close().await.unwrap();
}

/// A table with queues, kinds, workflows and the pause table (and, with
/// `errors`, an error history).
async fn workflow_db(errors: bool) -> Db {
    let db = Db::new().await;
    db.add_columns(
        |col| {
            col.queue = true;
            col.kind = true;
            col.error_history = errors;
        },
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            workflows_sql("jobs", &Default::default()).unwrap(),
        ],
    )
    .await;
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_follow_a_task_to_its_workflow_graph() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = workflow_db(false).await;
    let table = db.table_with(|t| t.workflows = true).await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let job = || NewJob::new();
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("fetch", job()))
                .task(Task::new("resize", job()).after(["fetch"]))
                .task(Task::new("scan", job()).after(["fetch"]))
                .task(Task::new("thumbnails", job()).after(["resize"]))
                .task(Task::new("publish", job()).after(["thumbnails", "scan"]))
                .task(Task::new("notify", job()).after(["publish"])),
        )
        .await
        .unwrap();
    // Fetch done, resize running: three states on the drawing.
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    let store = db.store_on(&table, so).await;
    let mut fetch = store
        .dequeue("browser-test", &DbConditions::new(), 1)
        .await
        .unwrap();
    assert!(store.mark_complete(&mut fetch[0]).await.unwrap());
    let resize = store
        .dequeue("browser-test", &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!(resize.len(), 1);
    let (base, _dashboard) = serve(&db, true).await;
    sign_in(&c, &base, "admin").await;

    // From a task's job page to its workflow's page.
    let scan = wf.id_of("scan").unwrap();
    c.goto(&format!("{base}/t/jobs/jobs/{scan}")).await.unwrap();
    page_with(&c, &format!("workflow {}", wf.id)).await;
    click(&c, Locator::Id("workflow-link")).await;
    at_url(&c, &format!("/t/jobs/workflows/{}", wf.id)).await;
    page_with(&c, &format!("Workflow {}", wf.id)).await;
    let svg = c.find(Locator::Id("workflow-graph")).await.unwrap();
    assert!(svg.is_displayed().await.unwrap(), "the drawing is shown");
    let nodes = c
        .find_all(Locator::Css("#workflow-graph g.node"))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 6);
    let edges = c
        .find_all(Locator::Css("#workflow-graph path.edge"))
        .await
        .unwrap();
    assert_eq!(edges.len(), 6);
    // Laid out: the drawing has room for its four layers, and every box
    // sits inside it.
    let size = c
        .execute(
            "const r = document.getElementById('workflow-graph').getBoundingClientRect(); return [r.width, r.height];",
            vec![],
        )
        .await
        .unwrap();
    assert!(size[0].as_f64().unwrap() > 4.0 * 176.0, "{size:?}");
    assert!(size[1].as_f64().unwrap() > 44.0, "{size:?}");
    let states: Vec<String> = {
        let mut v = Vec::new();
        for n in &nodes {
            v.push(n.attr("data-state").await.unwrap().unwrap());
        }
        v
    };
    for state in ["completed", "processing", "queued", "pending"] {
        assert!(states.iter().any(|s| s == state), "{states:?}");
    }
    shot(&c, "workflow").await;

    // A node leads to its task's job page.
    let notify = wf.id_of("notify").unwrap();
    click(&c, Locator::Css(&format!("#node-{notify}"))).await;
    at_url(&c, &format!("/t/jobs/jobs/{notify}")).await;
    page_with(&c, "State: pending").await;
    c.close().await.unwrap();
}

/// The cells of the table `css` finds, row by row, as the browser shows them.
async fn cells(c: &Client, css: &str) -> Vec<Vec<String>> {
    let found = c
        .execute(
            "const t = document.querySelector(arguments[0]); return t ? [...t.rows].map(r => [...r.cells].map(x => x.textContent.trim())) : [];",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    serde_json::from_value(found).unwrap()
}

/// A count from SQL.
async fn sql_count(db: &Db, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_every_state_counted_and_the_new_pages_in_a_real_browser() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = Db::new().await;
    db.add_columns(
        |col| {
            col.queue = true;
            col.kind = true;
            col.retention = true;
            col.error_history = true;
            col.max_retries = true;
        },
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
            workflows_sql("jobs", &Default::default()).unwrap(),
            node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
            leader_table_sql(DEFAULT_LEADER_TABLE).unwrap(),
        ],
    )
    .await;
    // Every state, in two queues; three workflows (running, failed, completed).
    db.execute(
        "INSERT INTO jobs (state, queue, kind, finished_at) SELECT 'completed', CASE WHEN i % 3 = 0 THEN 'reports' ELSE 'mail' END, 'send', now() - interval '2 hours' FROM generate_series(1, 300) AS i;
         INSERT INTO jobs (state, queue, kind, queued_at) SELECT 'queued', 'mail', 'send', now() - interval '2 minutes' FROM generate_series(1, 12);
         INSERT INTO jobs (state, queue, kind, process_after) SELECT 'queued', 'mail', 'send', now() + interval '1 hour' FROM generate_series(1, 4);
         INSERT INTO jobs (state, queue, kind, num_failures, max_retries, process_after, failure_message, errors) SELECT 'errored', 'reports', 'build', 1, 3, now() + interval '5 minutes', 'disk full',
           jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now() - interval '1 minute', 'worker', 'host-2', 'message', 'disk full')) FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue, kind, started_at, last_heartbeat_at, worker_hostname) SELECT 'processing', 'mail', 'send', now(), now(), 'a:1:x' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, kind, started_at, last_heartbeat_at, worker_hostname) SELECT 'processing', 'reports', 'build', now() - interval '1 hour', now() - interval '20 minutes', 'c:3:z' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, kind, num_failures, max_retries, failure_message, finished_at, payload, errors) SELECT 'failed', 'reports', 'build', 4, 3, 'SMTP 550: mailbox unavailable', now() - interval '10 minutes',
           '{\"customer\": {\"id\": 42, \"plan\": \"pro\"}}', jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now() - interval '30 minutes', 'worker', 'a:1:x', 'message', 'timeout'), jsonb_build_object('attempt', 2, 'at', now() - interval '20 minutes', 'worker', 'b:2:y', 'message', 'SMTP 550: mailbox unavailable')) FROM generate_series(1, 5);
         INSERT INTO jobs (state, queue, kind, finished_at) SELECT 'failed', 'mail', 'send', now() - interval '3 hours' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, kind, finished_at) SELECT 'canceled', 'mail', 'send', now() FROM generate_series(1, 3);
         INSERT INTO jobs (state, queue, kind, workflow_id, task_name, queued_at, finished_at) VALUES
           ('completed', 'mail', 'send', 11, 'fetch', now() - interval '1 day', now()), ('completed', 'mail', 'send', 11, 'send', now(), now()),
           ('completed', 'mail', 'send', 12, 'fetch', now() - interval '5 hours', now()), ('failed', 'mail', 'send', 12, 'send', now(), now()), ('canceled', 'mail', 'send', 12, 'notify', now(), now()),
           ('completed', 'mail', 'send', 13, 'fetch', now() - interval '10 minutes', now());
         WITH p AS (INSERT INTO jobs (state, queue, kind, workflow_id, task_name) SELECT 'pending', 'mail', 'send', 13, 'send' || i FROM generate_series(1, 2) AS i RETURNING id)
         INSERT INTO jobs_deps (job_id, depends_on) SELECT p.id, (SELECT id FROM jobs WHERE workflow_id = 13 AND task_name = 'fetch') FROM p;
         INSERT INTO dbworker_nodes (id, host, pid, version, queues, handlers, heartbeat_at) VALUES
           ('a:1:x', 'a', 1, '0.1.0', ARRAY['mail'], 8, now()),
           ('b:2:y', 'b', 2, '0.1.0', ARRAY['mail', 'reports'], 4, now() - interval '40 seconds'),
           ('c:3:z', 'c', 3, '0.1.0', ARRAY['reports'], 4, now() - interval '5 minutes');
         INSERT INTO dbworker_leaders (scope, node_id, term, acquired_at, expires_at) VALUES
           ('jobs', 'a:1:x', 3, now(), now() + interval '1 hour');
         ANALYZE jobs;",
    )
    .await;
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
            t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
            t.error_history_column = Some("errors".into());
            t.max_retries_column = Some("max_retries".into());
            t.payload_column = Some("payload".into());
            t.workflows = true;
        })
        .await;
    let (base, _dashboard) = serve_table(&db, table.clone(), |o| {
        o.node_table = Some(DEFAULT_NODE_TABLE.into());
        o.leader_table = Some(DEFAULT_LEADER_TABLE.into());
        // Room for the test's own seconds: stale past 30 s, dead past 60 s.
        o.dead_after = Duration::from_secs(60);
    })
    .await;
    sign_in(&c, &base, "admin").await;

    // The overview: every state per queue and in total, as SQL counts them.
    c.goto(&base).await.unwrap();
    page_with(&c, "Oldest waiting job").await;
    let shown = cells(&c, "table.state-counts").await;
    let heads = &shown[0];
    assert_eq!(
        heads[1..],
        dbworker::admin::STATE_COLUMNS.map(str::to_owned)
    );
    let condition = |column: &str| match column {
        "pending" => "state = 'pending' AND id IN (SELECT job_id FROM jobs_deps)",
        "scheduled" => "state = 'queued' AND process_after > now()",
        "available" => {
            "state IN ('queued', 'errored') AND COALESCE(process_after, '-infinity') <= now()"
        }
        "errored" => "state = 'errored'",
        "processing" => "state = 'processing'",
        "stalled" => {
            "state = 'processing' AND COALESCE(last_heartbeat_at, started_at) < now() - interval '30 seconds'"
        }
        "completed" => "state = 'completed'",
        "failed" => "state = 'failed'",
        "canceled" => "state = 'canceled'",
        "failed/1h" => "state = 'failed' AND finished_at >= now() - interval '1 hour'",
        other => panic!("no SQL for the column {other}"),
    };
    assert_eq!(shown.len(), 4, "mail, reports and the total: {shown:?}");
    for row in &shown[1..] {
        let queue = match row[0].as_str() {
            "total" => "true".to_owned(),
            q => format!("queue = '{q}'"),
        };
        for (column, cell) in heads[1..].iter().zip(&row[1..]) {
            let expected = sql_count(
                &db,
                &format!(
                    "SELECT count(*) FROM jobs WHERE {queue} AND {}",
                    condition(column)
                ),
            )
            .await;
            assert_eq!(
                cell,
                &expected.to_string(),
                "{} {column}: {shown:?}",
                row[0]
            );
        }
    }
    let total = &shown[3];
    assert!(
        total[1..].iter().all(|n| n != "0"),
        "every state is present: {shown:?}"
    );
    shot(&c, "overview-every-state").await;

    // The workflows list, from the nav: each workflow's counts as SQL has them.
    click(&c, Locator::LinkText("workflows")).await;
    page_with(&c, "Workflows · jobs").await;
    let shown = cells(&c, "table.workflows").await;
    let heads = shown[0].clone();
    assert_eq!(shown.len(), 4, "{shown:?}");
    let ids: Vec<&str> = shown[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(ids, ["13", "12", "11"], "newest first");
    let states: Vec<&str> = shown[1..].iter().map(|r| r[1].as_str()).collect();
    assert_eq!(states, ["running", "failed", "completed"]);
    for row in &shown[1..] {
        for (head, cell) in heads.iter().zip(row).skip(2).take(7) {
            let n = sql_count(
                &db,
                &format!(
                    "SELECT count(*) FROM jobs WHERE workflow_id = {} AND state = '{head}'",
                    row[0]
                ),
            )
            .await;
            assert_eq!(cell, &n.to_string(), "workflow {} {head}", row[0]);
        }
    }
    shot(&c, "workflows-list").await;
    c.find(Locator::Css("select[name=state]"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    click(&c, Locator::Css("form.filters:not(.goto) button")).await;
    at_url(&c, "state=failed").await;
    let shown = cells(&c, "table.workflows").await;
    assert_eq!(shown.len(), 2, "only workflow 12: {shown:?}");
    assert_eq!(shown[1][0], "12");
    click(&c, Locator::LinkText("12")).await;
    page_with(&c, "Workflow 12").await;

    // A limit set from the queues page holds at a worker's next claim.
    c.goto(&format!("{base}/t/jobs/queues")).await.unwrap();
    let form = "//tr[td[text()='mail']]//form[contains(@class, 'limit')]";
    c.find(Locator::XPath(&format!(
        "{form}//input[@name='max_processing']"
    )))
    .await
    .unwrap()
    .send_keys("3")
    .await
    .unwrap();
    click(&c, Locator::XPath(&format!("{form}//button[@value='set']"))).await;
    let page = page_with(&c, "Done: limit set on mail").await;
    assert!(page.contains("at most 3 processing"), "{page}");
    shot(&c, "queues-limits").await;
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    let store = db.store_on(&table, so).await;
    let claimed = store
        .dequeue("browser-test", &DbConditions::new(), 20)
        .await
        .unwrap();
    assert_eq!(
        claimed.len(),
        1,
        "2 were processing already; the limit is 3"
    );

    // A failed job's page, ordered as an operator reads it.
    let failed = sql_count(
        &db,
        "SELECT min(id) FROM jobs WHERE failure_message LIKE 'SMTP%'",
    )
    .await;
    c.goto(&format!("{base}/t/jobs/jobs/{failed}"))
        .await
        .unwrap();
    let page = page_with(&c, "State: failed").await;
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?}: {page}"))
    };
    assert!(
        at("attempts") < at("Times")
            && at("Times") < at("Errors")
            && at("Errors") < at("Payload")
            && at("Payload") < at("Execution logs")
            && at("Execution logs") < at("Other columns"),
        "{page}"
    );
    assert!(
        page.contains("4/3 failures") && page.contains("10m ago"),
        "{page}"
    );
    shot(&c, "job-operator").await;

    // The processes: heartbeat health and the leader.
    click(&c, Locator::LinkText("processes")).await;
    page_with(&c, "live of 3 registered").await;
    let shown = cells(&c, "table.processes").await;
    let health: Vec<(&str, &str)> = shown[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        health,
        [("a:1:x", "live"), ("b:2:y", "stale"), ("c:3:z", "dead")]
    );
    assert_eq!(shown[1][3], "leader of jobs");
    let live = sql_count(
        &db,
        "SELECT count(*) FROM dbworker_nodes WHERE heartbeat_at > now() - interval '60 seconds'",
    )
    .await;
    assert_eq!(
        c.find(Locator::Id("live-count"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        live.to_string()
    );
    shot(&c, "processes").await;

    // Auto-refresh: on, paused by its link, resumed by its link.
    click(&c, Locator::LinkText("every 5 s")).await;
    at_url(&c, "refresh=5").await;
    // With script the reload is live.js's (`data-reload`; the meta tag is
    // in <noscript>, not an element here).
    let refreshes = |c: Client| async move {
        c.find_all(Locator::Css("main[data-reload='5']"))
            .await
            .unwrap()
            .len()
    };
    assert_eq!(refreshes(c.clone()).await, 1);
    click(&c, Locator::Id("refresh-pause")).await;
    at_url(&c, "paused=5").await;
    let page = page_with(&c, "Auto-refresh: paused").await;
    assert_eq!(refreshes(c.clone()).await, 0, "{page}");
    shot(&c, "refresh-paused").await;
    // The nav keeps it paused; resuming brings the 5 s back.
    click(&c, Locator::LinkText("queues")).await;
    at_url(&c, "/t/jobs/queues?paused=5").await;
    click(&c, Locator::Id("refresh-resume")).await;
    at_url(&c, "refresh=5").await;
    page_with(&c, "Auto-refresh: every 5 s").await;
    assert_eq!(refreshes(c.clone()).await, 1);
    c.close().await.unwrap();
}

/// The cron page in a real browser: reached from the header's link, it
/// shows a Berlin schedule with its zone and ticks, and its last job links
/// to the job's page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_read_the_cron_page_and_follow_its_last_job() {
    use dbworker::cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions};
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = Db::new().await;
    db.execute(&dbworker::ddl::cron_table_sql(DEFAULT_CRON_TABLE).unwrap())
        .await;
    let table = db.table().await;
    let scheduler = Scheduler::new(&db.pool, &table, SchedulerOptions::default())
        .await
        .unwrap()
        .add_in_zone(
            "berlin-nightly",
            "30 2 * * *",
            "Europe/Berlin",
            NewJob::new(),
            Backfill::RunOnce,
        )
        .unwrap();
    scheduler.tick().await.unwrap();
    db.execute("UPDATE dbworker_cron SET last_tick = now() - interval '3 days'")
        .await;
    let job = scheduler.tick().await.unwrap()[0].1;

    let mut o = DashboardOptions::new(vec![table]);
    o.cron_table = Some(DEFAULT_CRON_TABLE.into());
    let dashboard = Dashboard::new(&db.pool, o).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://localhost:{}", listener.local_addr().unwrap().port());
    let app = dashboard.router();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    c.goto(&format!("{base}/")).await.unwrap();
    click(&c, Locator::LinkText("cron")).await;
    at_url(&c, "/t/jobs/cron").await;
    let text = page_with(&c, "berlin-nightly").await;
    assert!(
        text.contains("30 2 * * *") && text.contains("Europe/Berlin"),
        "{text}"
    );
    assert!(text.contains(" ago") && text.contains("in "), "{text}");
    shot(&c, "cron").await;
    click(&c, Locator::LinkText(&job.to_string())).await;
    at_url(&c, &format!("/t/jobs/jobs/{job}")).await;
    page_with(&c, &format!("{job}")).await;
    c.close().await.unwrap();
}

/// What the refresh bar says while a form holds the refresh back.
const WAITING: &str = "waiting while a form on this page is being filled in";

/// Tells the page its tab was hidden (or shown), as a browser does.
async fn tab_hidden(c: &Client, hidden: bool) {
    c.execute(
        &format!(
            "Object.defineProperty(document, 'hidden', {{ configurable: true, get: function () {{ return {hidden}; }} }}); document.dispatchEvent(new Event('visibilitychange')); return 1;"
        ),
        vec![],
    )
    .await
    .unwrap();
}

/// Waits up to `within` for the page's text to contain `needle`.
async fn text_within(c: &Client, needle: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(body) = c.find(Locator::Css("body")).await
            && let Ok(text) = body.text().await
            && text.contains(needle)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A page keeps itself current without a reload while its tab is visible,
/// and stops while it is hidden: a job failing meanwhile appears in the list
/// in place (the page's own state survives, checked boxes included), not
/// while the tab is hidden, and at once when it is shown again. Neither the
/// live update nor `?refresh=`'s reload replaces a form being filled in,
/// focused or left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_updates_itself_live_while_its_tab_is_visible() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = Db::new().await;
    let dashboard = Dashboard::new(&db.pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://localhost:{}", listener.local_addr().unwrap().port());
    let app = dashboard.router();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    c.goto(&format!("{base}/t/jobs/jobs?order=newest"))
        .await
        .unwrap();
    page_with(
        &c,
        "Auto-refresh: live (every 5 s while this tab is visible)",
    )
    .await;
    // A value of this page's own: a reload would lose it.
    c.execute("window.dbworkerMark = 42; return 1;", vec![])
        .await
        .unwrap();
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived while watching', now())")
        .await;
    assert!(
        text_within(&c, "arrived while watching", Duration::from_secs(15)).await,
        "the list updated in place"
    );
    let mark = c
        .execute("return window.dbworkerMark;", vec![])
        .await
        .unwrap();
    assert_eq!(mark, serde_json::json!(42), "no reload");
    shot(&c, "live-list").await;

    // A box the operator checked stays checked through an update.
    let checked = c
        .execute(
            "var b = document.querySelector('main input[type=checkbox][name=id]'); b.checked = true; return b.value;",
            vec![],
        )
        .await
        .unwrap();
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived after a check', now())")
        .await;
    assert!(
        text_within(&c, "arrived after a check", Duration::from_secs(15)).await,
        "the list updated in place"
    );
    let still = c
        .execute(
            "return Array.from(document.querySelectorAll('main input[name=id]:checked')).map(function (b) { return b.value; });",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        still,
        serde_json::json!([checked]),
        "the checked box survived"
    );
    c.execute(
        "document.querySelectorAll('main input[name=id]').forEach(function (b) { b.checked = false; }); return 1;",
        vec![],
    )
    .await
    .unwrap();

    // The tab hidden: no update.
    tab_hidden(&c, true).await;
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived while hidden', now())")
        .await;
    assert!(
        !text_within(&c, "arrived while hidden", Duration::from_secs(8)).await,
        "a hidden tab does not update"
    );
    // Shown again: updated at once.
    tab_hidden(&c, false).await;
    assert!(
        text_within(&c, "arrived while hidden", Duration::from_secs(3)).await,
        "a tab shown again updates at once"
    );
    // A form being filled in is never replaced; once left, the page catches up.
    c.execute(
        "document.querySelector('main input[name=failure]').focus(); return 1;",
        vec![],
    )
    .await
    .unwrap();
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived while typing', now())")
        .await;
    assert!(
        !text_within(&c, "arrived while typing", Duration::from_secs(8)).await,
        "a form being typed in is not replaced"
    );
    c.execute("document.activeElement.blur(); return 1;", vec![])
        .await
        .unwrap();
    assert!(
        text_within(&c, "arrived while typing", Duration::from_secs(8)).await,
        "the page catches up once the form is left"
    );
    // A form filled in and then left (the focus elsewhere) is not replaced
    // either, and the bar says the page waits; cleared, the page catches up.
    let filled = "document.querySelector('main input[name=failure]')";
    let field = c
        .find(Locator::Css("main input[name=failure]"))
        .await
        .unwrap();
    field.send_keys("timeout").await.unwrap();
    c.execute("document.activeElement.blur(); return 1;", vec![])
        .await
        .unwrap();
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived after typing', now())")
        .await;
    assert!(
        !text_within(&c, "arrived after typing", Duration::from_secs(8)).await,
        "a form filled in and left is not replaced"
    );
    assert!(
        text_within(&c, WAITING, Duration::from_secs(1)).await,
        "the bar says the page waits"
    );
    let value = c
        .execute(&format!("return {filled}.value;"), vec![])
        .await
        .unwrap();
    assert_eq!(value, serde_json::json!("timeout"), "what was typed stays");
    c.execute(
        &format!("var f = {filled}; f.value = f.defaultValue; return 1;"),
        vec![],
    )
    .await
    .unwrap();
    assert!(
        text_within(&c, "arrived after typing", Duration::from_secs(8)).await,
        "the page catches up once the form is cleared"
    );
    assert!(!text_within(&c, WAITING, Duration::from_millis(100)).await);

    // `?refresh=1` reloads the page, but not over a form filled in and left.
    c.goto(&format!("{base}/t/jobs/jobs?order=newest&refresh=1"))
        .await
        .unwrap();
    page_with(&c, "Auto-refresh: every 1 s").await;
    c.execute("window.dbworkerMark = 7; return 1;", vec![])
        .await
        .unwrap();
    c.find(Locator::Css("main input[name=failure]"))
        .await
        .unwrap()
        .send_keys("timeout")
        .await
        .unwrap();
    c.execute("document.activeElement.blur(); return 1;", vec![])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mark = c
        .execute("return window.dbworkerMark;", vec![])
        .await
        .unwrap();
    assert_eq!(mark, serde_json::json!(7), "no reload over the form");
    assert!(text_within(&c, WAITING, Duration::from_secs(1)).await);
    c.execute(
        &format!("var f = {filled}; f.value = f.defaultValue; return 1;"),
        vec![],
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        // Null once reloaded (an error while the page loads).
        if let Ok(mark) = c.execute("return window.dbworkerMark;", vec![]).await
            && mark.is_null()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reload once the form was cleared"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `?paused=` stops the live updates too.
    c.goto(&format!("{base}/t/jobs/jobs?order=newest&paused=5"))
        .await
        .unwrap();
    page_with(&c, "Auto-refresh: paused").await;
    db.execute("INSERT INTO jobs (state, failure_message, finished_at) VALUES ('failed', 'arrived while paused', now())")
        .await;
    assert!(
        !text_within(&c, "arrived while paused", Duration::from_secs(8)).await,
        "a paused page does not update"
    );
    c.close().await.unwrap();
}

/// The search suggests the queues and kinds the table holds and opens a job
/// by its id; a job's page draws its timeline (queued, each failed attempt
/// with its worker and error, the last attempt, the end); a workflow's page
/// retries its failed task (its dependent canceled with it comes back to
/// pending) and cancels the whole workflow, each after a confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_search_read_a_timeline_and_act_on_a_workflow() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let db = workflow_db(true).await;
    let table = db
        .table_with(|t| {
            t.workflows = true;
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.error_history_column = Some("errors".into());
        })
        .await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new(
                    "fetch",
                    NewJob::new().queue("media").kind("fetch_image"),
                ))
                .task(
                    Task::new("resize", NewJob::new().queue("media").kind("resize"))
                        .after(["fetch"]),
                ),
        )
        .await
        .unwrap();
    let (fetch, resize) = (wf.id_of("fetch").unwrap(), wf.id_of("resize").unwrap());
    // The fetch fails twice, the second time for good.
    let mut so = db.options();
    so.handling = Handling::Heartbeat;
    so.max_num_retries = 1;
    so.retry = dbworker::RetryPolicy::fixed(Duration::ZERO);
    let store = db.store_on(&table, so).await;
    for message in [
        "timeout talking to the image server",
        "image server said 500",
    ] {
        let mut got = store
            .dequeue("host-a", &DbConditions::new(), 1)
            .await
            .unwrap();
        assert_eq!(got[0].record().id, fetch);
        assert!(
            store
                .mark_errored(&mut got[0], message, None)
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(db.state(fetch).await, "failed");
    assert_eq!(
        db.state(resize).await,
        "canceled",
        "canceled with its upstream"
    );

    let (base, _dashboard) = serve_table(&db, table, |_| {}).await;
    sign_in(&c, &base, "admin").await;

    // Suggestions and the id box.
    c.goto(&format!("{base}/t/jobs/jobs")).await.unwrap();
    page_with(&c, "Open").await;
    let options = |list: &'static str| {
        let c = c.clone();
        async move {
            let mut values = Vec::new();
            for o in c
                .find_all(Locator::Css(&format!("datalist#{list} option")))
                .await
                .unwrap()
            {
                values.push(o.attr("value").await.unwrap().unwrap_or_default());
            }
            values
        }
    };
    assert_eq!(options("queues").await, ["media"]);
    assert_eq!(options("kinds").await, ["fetch_image", "resize"]);
    c.find(Locator::Css("input[name=id]"))
        .await
        .unwrap()
        .send_keys(&fetch.to_string())
        .await
        .unwrap();
    click(&c, Locator::Id("go-to-job")).await;
    at_url(&c, &format!("/t/jobs/jobs/{fetch}")).await;

    // The timeline.
    let rows = cells(&c, "#timeline").await;
    let text: Vec<String> = rows.iter().map(|r| r.join(" | ")).collect();
    // The heading, then queued, two failed attempts, failed.
    let rows = &rows[1..];
    assert_eq!(
        rows.len(),
        4,
        "queued, two failed attempts, failed: {text:?}"
    );
    assert!(rows[0][1].contains("queued"), "{text:?}");
    assert!(
        rows[1][1].contains("attempt 1 failed on host-a")
            && rows[1][1].contains("timeout talking to the image server"),
        "{text:?}"
    );
    assert!(
        rows[2][1].contains("attempt 2 failed on host-a") && rows[2][1].contains("after "),
        "{text:?}"
    );
    assert!(
        rows[3][1].starts_with("failed") && rows[3][1].contains("image server said 500"),
        "{text:?}"
    );
    shot(&c, "job-timeline").await;

    // Retry the workflow's failed task: confirmed, then its dependent is
    // pending again behind it.
    c.goto(&format!("{base}/t/jobs/workflows/{}", wf.id))
        .await
        .unwrap();
    click(&c, Locator::Id("workflow-requeue")).await;
    page_with(&c, "Yes, requeue 1 job(s)").await;
    click(&c, Locator::Css("button.danger")).await;
    page_with(&c, "Done: requeue 1").await;
    assert_eq!(db.state(fetch).await, "queued");
    assert_eq!(
        db.state(resize).await,
        "pending",
        "back behind its upstream"
    );

    // Cancel the whole workflow.
    c.goto(&format!("{base}/t/jobs/workflows/{}", wf.id))
        .await
        .unwrap();
    click(&c, Locator::Id("workflow-cancel")).await;
    page_with(&c, "Yes, cancel 2 job(s)").await;
    click(&c, Locator::Css("button.danger")).await;
    page_with(&c, "Done: cancel 2").await;
    assert_eq!(db.state(fetch).await, "canceled");
    assert_eq!(db.state(resize).await, "canceled");
    c.close().await.unwrap();
}
