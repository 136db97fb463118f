//! The dashboard's routes and actions against real Postgres, through the
//! router itself: pages, filters, keyset pages, every action with its CSRF and
//! role checks, hidden fields, hostile text escaped, and a prefix mount.

use crate::common;
use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dbworker::JobTable;
use dbworker::control::{DEFAULT_LIMIT_TABLE, DEFAULT_PAUSE_TABLE, Limit, Limits};
use dbworker::dashboard::{Auth, BasicUser, Dashboard, DashboardOptions, Role};
use tower::ServiceExt;

use common::Db;
use router::{csrf, post};
use shared::{seed, seed_partitioned};

async fn table(db: &Db) -> JobTable {
    db.table_with(|t| {
        t.queue_column = Some("queue".into());
        t.kind_column = Some("kind".into());
        t.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    })
    .await
}

async fn dashboard(db: &Db, auth: Auth) -> Dashboard {
    let mut o = DashboardOptions::new(vec![table(db).await]);
    o.auth = auth;
    o.hidden_fields = vec!["api_key".into()];
    Dashboard::new(&db.pool, o).await.unwrap()
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get(
    app: &Router,
    path: &str,
    auth: Option<&str>,
) -> (StatusCode, String, axum::http::HeaderMap) {
    let mut r = Request::get(path);
    if let Some(a) = auth {
        r = r.header(header::AUTHORIZATION, a);
    }
    let res = app
        .clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

#[tokio::test]
async fn pages_render_counts_filters_and_escape_hostile_text() {
    pages_render_counts_filters_and_escape_hostile_text_on(seed().await).await;
}

/// The same on a partitioned table, the jobs in ten partitions.
#[tokio::test]
async fn on_a_partitioned_table_pages_render_counts_filters_and_escape_hostile_text() {
    pages_render_counts_filters_and_escape_hostile_text_on(seed_partitioned().await).await;
}

async fn pages_render_counts_filters_and_escape_hostile_text_on((db, failed): (Db, i64)) {
    let app = dashboard(&db, Auth::None).await.router();

    let (status, page, headers) = get(&app, "/", None).await;
    assert_eq!(status, StatusCode::OK);
    let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("script-src 'self';")
            && !csp.contains("unsafe"),
        "{csp}"
    );
    assert!(
        page.contains(
            // pending, scheduled, available, errored, processing
            "<td>mail</td><td class=\"num\">0</td><td class=\"num\">0</td><td class=\"num\">30</td><td class=\"num\">0</td><td class=\"num\">1</td>"
        ),
        "{page}"
    );
    assert!(page.contains("Oldest waiting job"), "{page}");
    assert!(page.contains("<th>total</th>"), "{page}");
    // One script, the dashboard's own file: nothing inline.
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(
        page.contains("<script src=\"/assets/live.js\" defer></script>"),
        "{page}"
    );
    let (status, script, _) = get(&app, "/assets/live.js", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(script.contains("visibilitychange"), "{script}");

    // Filter by a payload field; hostile failure text is escaped.
    let (status, page, _) = get(&app, "/t/jobs/jobs?field=payload.customer_id%3D42", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(&format!("/t/jobs/jobs/{failed}\">{failed}</a>")),
        "{page}"
    );
    assert_eq!(
        page.matches("type=\"checkbox\"").count(),
        1,
        "only the matching job"
    );
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quotes&quot;"),
        "{page}"
    );
    assert!(!page.contains("<script>alert"), "{page}");

    // Keyset pages of 50 would hold all 32; by state and queue, newest first.
    let (_, page, _) = get(
        &app,
        "/t/jobs/jobs?state=queued&queue=mail&order=newest",
        None,
    )
    .await;
    assert_eq!(page.matches("type=\"checkbox\"").count(), 30);
    assert!(!page.contains("Next page"), "{page}");

    // Job detail: pretty payload, the secret hidden, hostile payload escaped.
    let (status, page, _) = get(&app, &format!("/t/jobs/jobs/{failed}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("[hidden]") && !page.contains("sk-live-123"),
        "{page}"
    );
    assert!(
        page.contains("&lt;img src=x onerror=alert(2)&gt;"),
        "{page}"
    );
    assert!(page.contains("Retry now"), "{page}");

    // Hidden fields cannot be filtered on (no oracle); bad filters are 400s.
    let (status, _, _) = get(
        &app,
        "/t/jobs/jobs?field=payload.api_key%3Dsk-live-123",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Nor through a value holding one: the whole column as Postgres prints
    // it, or a parent object of the hidden key, would list the job only when
    // the guessed secret is right.
    let whole = r#"payload={"note": "<img src=x onerror=alert(2)>", "api_key": "sk-live-123", "customer_id": "42"}"#;
    let parent = r#"payload.billing={"plan": "pro", "api_key": "sk-live-123"}"#;
    for field in [whole, parent] {
        let (status, page, _) =
            get(&app, &format!("/t/jobs/jobs?field={}", encode(field)), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {page}");
        assert!(page.contains("field: that field is hidden"), "{page}");
    }
    let (status, _, _) = get(&app, "/t/jobs/jobs?state=bogus", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = get(&app, "/t/nope/jobs", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get(&app, "/t/jobs/jobs/999999", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, css, _) = get(&app, "/assets/style.css", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(css.contains("svg.chart"));
    // Dark mode follows the browser's preference.
    assert!(css.contains("@media (prefers-color-scheme: dark)"), "{css}");
}

#[tokio::test]
async fn actions_need_the_token_an_admin_and_the_same_origin() {
    actions_need_the_token_an_admin_and_the_same_origin_on(seed().await).await;
}

/// The same on a partitioned table, the jobs in ten partitions.
#[tokio::test]
async fn on_a_partitioned_table_actions_need_the_token_an_admin_and_the_same_origin() {
    actions_need_the_token_an_admin_and_the_same_origin_on(seed_partitioned().await).await;
}

async fn actions_need_the_token_an_admin_and_the_same_origin_on((db, failed): (Db, i64)) {
    let app = dashboard(&db, Auth::None).await.router();
    let (_, page, _) = get(&app, &format!("/t/jobs/jobs/{failed}"), None).await;
    let token = csrf(&page);
    let path = format!("/t/jobs/jobs/{failed}/action");

    let (status, _, _) = post(&app, &path, "action=requeue&csrf=wrong", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let cross_site = Request::post(&path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(format!("action=requeue&csrf={token}")))
        .unwrap();
    assert_eq!(
        app.clone().oneshot(cross_site).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(db.state(failed).await, "failed", "nothing happened");

    let (status, _, location) =
        post(&app, &path, &format!("action=requeue&csrf={token}"), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // The notice, tagged so that only the dashboard can write it.
    let location = location.unwrap();
    assert!(
        location.starts_with(&format!("/t/jobs/jobs/{failed}?done=requeue&sig=")),
        "{location}"
    );
    assert_eq!(db.state(failed).await, "queued");
    // Cancel it again; a second cancel finds nothing to do.
    post(&app, &path, &format!("action=cancel&csrf={token}"), None).await;
    assert_eq!(db.state(failed).await, "canceled");
    let (_, _, location) = post(&app, &path, &format!("action=fail&csrf={token}"), None).await;
    assert!(location.unwrap().contains("done=nothing&sig="));

    // Bulk on the selection: a confirmation with the count, then the action.
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 3")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let selection: String = ids.iter().map(|id| format!("&id={id}")).collect();
    let form = format!("csrf={token}&action=fail&scope=selected{selection}");
    let (status, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("fail 3 job(s)"), "{page}");
    assert_eq!(db.count("failed").await, 0);
    let (status, _, _) = post(&app, "/t/jobs/bulk", &format!("{form}&confirm=yes"), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(db.count("failed").await, 3);

    // Complete and reschedule, on the selection: the processing job is
    // never touched.
    let processing: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'processing'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let form = format!(
        "csrf={token}&action=reschedule&run_in_secs=3600&scope=selected&id={}&id={processing}",
        ids[0]
    );
    post(&app, "/t/jobs/bulk", &format!("{form}&confirm=yes"), None).await;
    assert_eq!(db.state(ids[0]).await, "queued");
    let delay: f64 = db
        .scalar(
            "SELECT EXTRACT(EPOCH FROM process_after - now())::float8 FROM jobs WHERE id = $1",
            ids[0],
        )
        .await;
    assert!(delay > 3500.0, "{delay}");
    let form = format!(
        "csrf={token}&action=complete&scope=selected&id={}&id={processing}",
        ids[0]
    );
    let (_, _, location) = post(&app, "/t/jobs/bulk", &format!("{form}&confirm=yes"), None).await;
    assert!(location.unwrap().contains("done=complete+1"));
    assert_eq!(db.state(ids[0]).await, "completed");
    assert_eq!(db.state(processing).await, "processing");

    // Bulk on everything matching a filter: the count includes only the
    // states the action may touch; the processing job is never deleted.
    let form = format!("csrf={token}&action=delete&scope=matching&f_queue=mail");
    let (_, page, _) = post(&app, "/t/jobs/bulk", &form, None).await;
    assert!(page.contains("delete 30 job(s)"), "{page}");
    post(&app, "/t/jobs/bulk", &router::confirmation(&page), None).await;
    assert_eq!(db.count("processing").await, 1);
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE queue = 'mail'")
            .fetch_one(&db.pool)
            .await
            .unwrap(),
        1
    );
    let (status, _, _) = post(
        &app,
        "/t/jobs/bulk",
        &format!("csrf={token}&action=delete&scope=matching"),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "never the whole table without a filter"
    );

    // Pause and resume a queue; the queues page shows it and its limit.
    Limits::new(&db.pool, &table(&db).await)
        .await
        .unwrap()
        .set_limit("reports", Limit::processing(2))
        .await
        .unwrap();
    post(
        &app,
        "/t/jobs/queues/pause",
        &format!("csrf={token}&queue=reports&do=pause"),
        None,
    )
    .await;
    let (_, page, _) = get(&app, "/t/jobs/queues", None).await;
    assert!(page.contains("<td>reports</td>"), "{page}");
    assert!(page.contains("<strong>paused</strong>"), "{page}");
    assert!(page.contains("at most 2 processing"), "{page}");
    let paused: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dbworker_pauses WHERE queue = 'reports'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(paused, 1);
    post(
        &app,
        "/t/jobs/queues/pause",
        &format!("csrf={token}&queue=reports&do=resume"),
        None,
    )
    .await;
    let paused: i64 = sqlx::query_scalar("SELECT count(*) FROM dbworker_pauses")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(paused, 0);
}

#[tokio::test]
async fn bearer_and_basic_auth_with_two_roles() {
    let (db, failed) = seed().await;
    let bearer = Auth::Bearer {
        admin: Some("admin-secret".into()),
        read_only: Some("read-secret".into()),
    };
    let app = dashboard(&db, bearer).await.router();
    let (status, _, headers) = get(&app, "/", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.contains_key(header::WWW_AUTHENTICATE));
    let (status, _, _) = get(&app, "/", Some("Bearer wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let read = Some("Bearer read-secret");
    let (status, page, _) = get(&app, &format!("/t/jobs/jobs/{failed}"), read).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !page.contains("Retry now") && !page.contains("name=\"csrf\""),
        "no actions for readers"
    );
    assert!(page.contains("read-only"), "{page}");
    // No page gives a reader the admins' token: not the job list (its bulk
    // form), nor the queues page.
    for path in ["/t/jobs/jobs", "/t/jobs/queues", "/"] {
        let (status, page, _) = get(&app, path, read).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(!page.contains("name=\"csrf\""), "{path}: {page}");
    }
    let (_, page, _) = get(&app, "/t/jobs/jobs", Some("Bearer admin-secret")).await;
    assert!(page.contains("name=\"csrf\""), "{page}");
    let (_, admin_page, _) = get(
        &app,
        &format!("/t/jobs/jobs/{failed}"),
        Some("Bearer admin-secret"),
    )
    .await;
    let token = csrf(&admin_page);
    let (status, _, _) = post(
        &app,
        &format!("/t/jobs/jobs/{failed}/action"),
        &format!("action=requeue&csrf={token}"),
        read,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(db.state(failed).await, "failed");

    let basic = Auth::Basic(vec![BasicUser {
        name: "ops".into(),
        password: "pa:ss".into(),
        role: Role::Admin,
    }]);
    let app = dashboard(&db, basic).await.router();
    let (status, _, headers) = get(&app, "/", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        headers[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    // "ops:pa:ss" in base64.
    let (status, page, _) = get(&app, "/", Some("Basic b3BzOnBhOnNz")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("ops · admin"), "{page}");
}

#[tokio::test]
async fn mounted_under_a_prefix_every_link_keeps_it() {
    let (db, failed) = seed().await;
    let d = dashboard(&db, Auth::None).await;
    let app = Router::new().nest("/admin/jobs", d.router());
    let (status, page, _) = get(&app, "/admin/jobs/t/jobs/jobs?state=failed", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("href=\"/admin/jobs/assets/style.css\""),
        "{page}"
    );
    assert!(
        page.contains(&format!("href=\"/admin/jobs/t/jobs/jobs/{failed}\"")),
        "{page}"
    );
    assert!(
        page.contains("action=\"/admin/jobs/t/jobs/bulk\""),
        "{page}"
    );
}

#[tokio::test]
async fn renamed_columns_are_read_by_their_configured_names() {
    let renames: std::collections::HashMap<String, String> = [
        ("state".to_owned(), "status".to_owned()),
        ("execution_logs".to_owned(), "logs".to_owned()),
    ]
    .into_iter()
    .collect();
    let db = Db::with_renames(&renames).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (status, failure_message, logs) VALUES ('errored', 'try again', ARRAY[json_build_object('key', 'step', 'out', 'ran 1 of 2')]) RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let t = db.table_with(|t| t.alternate_column_names = renames).await;
    let d = Dashboard::new(&db.pool, DashboardOptions::new(vec![t]))
        .await
        .unwrap();
    let app = d.router();
    let (status, page, _) = get(&app, &format!("/t/jobs/jobs/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("<span class=\"state-errored\">errored</span>"),
        "{page}"
    );
    assert!(page.contains("ran 1 of 2"), "the execution logs: {page}");
    let (_, page, _) = get(&app, "/t/jobs/jobs?state=errored", None).await;
    assert!(page.contains(&format!(">{id}</a>")), "{page}");
}

/// Follows the "Next page" links from `path`; the ids in page order.
async fn all_pages(app: &Router, path: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut next = path.to_owned();
    for _ in 0..20 {
        let (status, page, _) = get(app, &next, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let mut rest = page.as_str();
        while let Some(at) = rest.find("name=\"id\" value=\"") {
            rest = &rest[at + 17..];
            ids.push(rest[..rest.find('"').unwrap()].parse().unwrap());
        }
        // The "Next page" link (the refresh links, before it, keep `after` too).
        let Some(at) = page
            .find("Next page")
            .and_then(|end| page[..end].rfind("<a href=\"?after="))
        else {
            return ids;
        };
        let href = &page[at + 9..];
        let href = &href[..href.find('"').unwrap()];
        next = format!("/t/jobs/jobs{}", href.replace("&amp;", "&"));
    }
    panic!("too many pages");
}

#[tokio::test]
async fn pages_are_keyset_paged_in_every_sort() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, num_failures, finished_at) SELECT 'failed', i % 3, now() - i * interval '1 minute' FROM generate_series(1, 11) AS i",
    )
    .await;
    let mut o = DashboardOptions::new(vec![db.table().await]);
    o.page_size = 4;
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let rows: Vec<(i64, i32)> = sqlx::query_as("SELECT id, num_failures FROM jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();

    let mut by_id: Vec<i64> = rows.iter().map(|r| r.0).collect();
    by_id.sort_unstable();
    assert_eq!(all_pages(&app, "/t/jobs/jobs").await, by_id);

    let mut by_failures = rows.clone();
    by_failures
        .sort_by_key(|(id, failures)| (std::cmp::Reverse(*failures), std::cmp::Reverse(*id)));
    let expected: Vec<i64> = by_failures.iter().map(|r| r.0).collect();
    assert_eq!(
        all_pages(&app, "/t/jobs/jobs?sort=failures&order=newest").await,
        expected,
        "most failures first, ties newest first, across 3 pages"
    );

    // Finished longest ago first: the highest id finished earliest here.
    let mut by_finish = by_id.clone();
    by_finish.reverse();
    assert_eq!(
        all_pages(&app, "/t/jobs/jobs?sort=finished_at").await,
        by_finish
    );

    let (status, _, _) = get(&app, "/t/jobs/jobs?sort=payload", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// The jobs page suggests the queues the table holds, asked once and reused
/// (a page updating itself every few seconds must not ask each time): a
/// queue that appears meanwhile is suggested once the minute has passed.
#[tokio::test]
async fn the_jobs_page_suggests_queues_and_reuses_what_it_asked() {
    let (db, _) = seed().await;
    let app = dashboard(&db, Auth::None).await.router();
    let (status, page, _) = get(&app, "/t/jobs/jobs", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("<datalist id=\"queues\">") && page.contains("<option value=\"mail\">"),
        "{page}"
    );
    db.execute("INSERT INTO jobs (queue) VALUES ('brand-new')")
        .await;
    let (_, page, _) = get(&app, "/t/jobs/jobs", None).await;
    let queues = page
        .split("<datalist id=\"queues\">")
        .nth(1)
        .and_then(|rest| rest.split("</datalist>").next())
        .unwrap();
    assert!(queues.contains("\"mail\""), "{queues}");
    assert!(
        !queues.contains("brand-new"),
        "asked again within the minute"
    );
    assert!(page.contains("brand-new"), "the list itself is current");
}
