//! Requests to a dashboard's router without a server, shared by the
//! dashboard tests that read pages (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

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
