//! A list filtered by failure text or payload field looks at a bounded window
//! of rows per page, says where it stopped, and the next page continues
//! there: paged to the end, in either order, it yields every match exactly
//! once, in order; through `Admin::list` and the dashboard's job list.

use crate::common;
use crate::fixtures::router;

use axum::Router;
use axum::http::StatusCode;
use dbworker::admin::{Admin, FieldFilter, JobFilter, JobPage, PageRequest, SEARCH_WINDOW};
use dbworker::dashboard::{Dashboard, DashboardOptions};

use common::Db;
use router::get;

/// `n` failed jobs (ids in a row from the first returned), the `i`-th
/// (1-based) failing with `message(i)` and given `{"customer": "<i % 50>"}`.
async fn seed(db: &Db, n: i64, matching: &str) -> i64 {
    let sql = format!(
        "INSERT INTO jobs (state, failure_message, payload)
         SELECT 'failed', CASE WHEN {matching} THEN 'upstream TIMEOUT after 30s' WHEN i % 3 = 0 THEN NULL ELSE 'time out, not a match' END,
                jsonb_build_object('customer', (i % 50)::text)
         FROM generate_series(1, $1::bigint) AS i RETURNING id"
    );
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(n)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    ids[0]
}

/// The ids matching `condition` (raw SQL), in the list's order.
async fn expected(db: &Db, condition: &str, newest: bool) -> Vec<i64> {
    let order = if newest { "DESC" } else { "ASC" };
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM jobs WHERE {condition} ORDER BY id {order}"
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Every page of `filter` from the start; the ids and the pages.
async fn all_pages(
    admin: &Admin,
    filter: &JobFilter,
    size: u32,
    window: u32,
    newest: bool,
) -> (Vec<i64>, Vec<(Option<i64>, JobPage)>) {
    let (mut ids, mut pages, mut after) = (Vec::new(), Vec::new(), None);
    loop {
        let mut request = PageRequest::first(size);
        request.after = after;
        request.newest_first = newest;
        request.search_window = window;
        let page = admin.list(filter, request).await.unwrap();
        assert!(page.jobs.len() <= size as usize, "{page:?}");
        ids.extend(page.jobs.iter().map(|j| j.id));
        let next = page.next;
        pages.push((after, page));
        assert!(pages.len() < 1000, "too many pages");
        match next {
            Some(n) => after = Some(n),
            None => return (ids, pages),
        }
    }
}

#[tokio::test]
async fn admin_list_searches_a_bounded_window_per_page_and_misses_nothing() {
    let db = Db::new().await;
    // Matches: the first and last rows, a run longer than a page, a few
    // scattered, and a gap of several windows with none.
    let first = seed(
        &db,
        1000,
        "i IN (1, 1000, 17, 250, 251, 252, 253, 254, 255, 256, 257, 399, 400, 401) OR (i > 850 AND i % 37 = 0)",
    )
    .await;
    let admin = Admin::new(&db.pool, &db.table().await).await.unwrap();
    let mut timeout = JobFilter::default();
    timeout.failure_contains = Some("timeout".into());
    let condition = "failure_message ILIKE '%timeout%'";
    for newest in [false, true] {
        let want = expected(&db, condition, newest).await;
        assert_eq!(want.len(), 19);
        let (ids, pages) = all_pages(&admin, &timeout, 5, 100, newest).await;
        assert_eq!(ids, want, "newest first: {newest}");
        // A page that stopped short looked at exactly the window: its
        // `next` is 100 ids past its cursor.
        let mut stopped = 0;
        for (after, page) in &pages {
            if let Some(rows) = page.searched {
                stopped += 1;
                assert_eq!(rows, 100);
                assert!(page.jobs.len() < 5, "{page:?}");
                let from = after.unwrap_or(if newest { first + 1000 } else { first - 1 });
                let step = if newest { -100 } else { 100 };
                assert_eq!(page.next, Some(from + step), "{page:?}");
            }
        }
        // The gap from 402 to 850 holds four empty windows at least.
        assert!(
            pages
                .iter()
                .filter(|(_, p)| p.searched.is_some() && p.jobs.is_empty())
                .count()
                >= 4,
            "{pages:?}"
        );
        assert!(stopped >= 6, "{pages:?}");
        // The last page ends the list.
        let (_, last) = pages.last().unwrap();
        assert_eq!((last.next, last.searched), (None, None));
    }

    // A payload field, by the same windows.
    let mut customer = JobFilter::default();
    customer.fields = vec![FieldFilter::new("payload", &["customer"], "7").unwrap()];
    for newest in [false, true] {
        let want = expected(&db, "payload->>'customer' = '7'", newest).await;
        assert_eq!(want.len(), 20);
        let (ids, pages) = all_pages(&admin, &customer, 3, 64, newest).await;
        assert_eq!(ids, want, "newest first: {newest}");
        assert!(pages.iter().any(|(_, p)| p.searched == Some(64)));
    }

    // No bound: one page fills up however far its matches are.
    let (ids, pages) = all_pages(&admin, &timeout, 19, 0, false).await;
    assert_eq!(ids, expected(&db, condition, false).await);
    assert!(pages.iter().all(|(_, p)| p.searched.is_none()));
    // Without a text or field condition the window does not apply.
    let (_, pages) = all_pages(&admin, &JobFilter::default(), 1000, 10, false).await;
    assert_eq!(pages[0].1.jobs.len(), 1000);
    assert_eq!(PageRequest::first(5).search_window, SEARCH_WINDOW);
}

/// The job ids listed on a dashboard page, and its next link.
fn rows(page: &str) -> (Vec<i64>, Option<String>) {
    let ids = page
        .split("href=\"/t/jobs/jobs/")
        .skip(1)
        .filter_map(|rest| rest[..rest.find('"').unwrap()].parse().ok())
        .collect();
    let next = ["search on →", "Next page →"].iter().find_map(|label| {
        let end = page.find(&format!("\">{label}"))?;
        let start = page[..end].rfind("href=\"")? + "href=\"".len();
        Some(page[start..end].replace("&amp;", "&"))
    });
    (ids, next)
}

async fn dashboard_pages(app: &Router, query: &str) -> (Vec<i64>, Vec<String>) {
    let (mut ids, mut bodies, mut next) = (Vec::new(), Vec::new(), Some(query.to_owned()));
    while let Some(q) = next.take() {
        let (status, page) = get(app, &format!("/t/jobs/jobs{q}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let (more, link) = rows(&page);
        ids.extend(more);
        next = link;
        bodies.push(page);
        assert!(bodies.len() < 50, "too many pages");
    }
    (ids, bodies)
}

#[tokio::test]
async fn the_dashboards_failure_filter_pages_by_search_window() {
    let db = Db::new().await;
    let rows = 2 * i64::from(SEARCH_WINDOW) + 20_000;
    let first = seed(&db, rows, "i IN (5, 70000, 70001, 119999)").await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap()
        .router();
    let condition = "failure_message ILIKE '%timeout%'";
    let (ids, bodies) = dashboard_pages(&app, "?failure=timeout&order=oldest").await;
    assert_eq!(ids, expected(&db, condition, false).await);
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    let stop = first - 1 + i64::from(SEARCH_WINDOW);
    assert!(
        bodies[0].contains(&format!(
            "Searched {SEARCH_WINDOW} rows down to id {stop}, no more matches yet"
        )),
        "{}",
        bodies[0]
    );
    assert!(!bodies[2].contains("Searched"), "{}", bodies[2]);
    let (ids, _) = dashboard_pages(&app, "?failure=timeout&order=newest").await;
    assert_eq!(ids, expected(&db, condition, true).await);
    // A search without an order asked for starts at the newest matches.
    let (ids, _) = dashboard_pages(&app, "?failure=timeout").await;
    assert_eq!(ids, expected(&db, condition, true).await);
}
