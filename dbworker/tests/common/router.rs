//! Requests to a dashboard's router without a server, shared by the
//! dashboard tests that read pages (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dbworker::JobTableOptions;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use tower::ServiceExt;

use crate::common::Db;

/// A dashboard over `db`'s `jobs` table, its options set by `set`, as a router.
pub async fn dashboard(db: &Db, set: impl FnOnce(&mut JobTableOptions)) -> Router {
    let table = db.table_with(set).await;
    Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router()
}

/// GETs `path`; returns the status and the body as text.
pub async fn get(app: &Router, path: &str) -> (StatusCode, String) {
    let res = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// GETs `path` with an `Authorization` header.
pub async fn get_as(app: &Router, path: &str, auth: &str) -> (StatusCode, String) {
    let res = app
        .clone()
        .oneshot(
            Request::get(path)
                .header(header::AUTHORIZATION, auth)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// POSTs `form` to `path` as a same-origin page would (with `auth` as its
/// `Authorization`, if any); returns the status, the body and where it
/// redirects.
pub async fn post(
    app: &Router,
    path: &str,
    form: &str,
    auth: Option<&str>,
) -> (StatusCode, String, Option<String>) {
    let mut r = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "localhost")
        .header(header::ORIGIN, "http://localhost")
        .header("sec-fetch-site", "same-origin");
    if let Some(a) = auth {
        r = r.header(header::AUTHORIZATION, a);
    }
    let res = app
        .clone()
        .oneshot(r.body(Body::from(form.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let location = res
        .headers()
        .get(header::LOCATION)
        .map(|l| l.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        location,
    )
}

/// The CSRF token of the first form on `page`.
pub fn csrf(page: &str) -> String {
    let start = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a token")
        + 19;
    page[start..][..page[start..].find('"').unwrap()].to_owned()
}

/// The hidden fields of a confirmation `page`, as its form posts them.
pub fn confirmation(page: &str) -> String {
    let mut fields = Vec::new();
    for part in page.split(r#"<input type="hidden" name=""#).skip(1) {
        let name = &part[..part.find('"').unwrap()];
        let rest = &part[part.find(r#"value=""#).unwrap() + 7..];
        let value = &rest[..rest.find('"').unwrap()];
        // The tests' values need no escaping (tokens, words, ids).
        fields.push(format!("{name}={value}"));
    }
    fields.join("&")
}
