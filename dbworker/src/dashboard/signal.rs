//! Sending a waiting job its signal from its page (a table with signals,
//! `dbworker migration --signals`): the job page says what the job waits
//! for and, to an admin, offers a form (the signal's name, prefilled with
//! the awaited one, and an optional JSON payload) that goes through the
//! table's [`Signals`](crate::Signals), as `dbworker signal` does, so the
//! job is woken at once.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::actions::{AdminForm, field};
use super::{Shared, Table, Viewer, bad_parameter, server_error, url_escape};
use crate::error::{Error, has_sqlstate};
use crate::job_filter::excerpt;

/// The admin's form for job `id`, which waits for `awaiting`.
pub(super) fn form(viewer: &Viewer, s: &Shared, t: &Table, id: i64, awaiting: &str) -> Markup {
    let url = viewer.href(&format!("/t/{}/jobs/{id}/signal", url_escape(&t.name)));
    html! {
        form id="signal-form" class="signal" method="post" action=(url) {
            input type="hidden" name="csrf" value=(s.csrf);
            label { "Signal " input name="name" value=(awaiting) size="24" required; }
            " "
            label {
                "Payload (JSON, optional) "
                textarea name="payload" rows="2" cols="40" placeholder="{\"amount\": 42}" {}
            }
            " " button type="submit" { "Send signal" }
        }
    }
}

/// `POST /t/{table}/jobs/{id}/signal`: sends the signal `name` with the
/// `payload` (empty: none) and returns to the job's page. A missing name or
/// a payload that is not JSON is refused, naming it, and sends nothing; a
/// job that does not exist (deleted, purged) is a 404 that says so.
pub(super) async fn send(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path((table, id)): Path<(String, i64)>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let signals = t.signals.as_ref().ok_or_else(|| {
        let why = if s.options.read_only {
            "a read-only dashboard sends no signals"
        } else {
            "this table has no signals (dbworker migration --signals)"
        };
        (StatusCode::BAD_REQUEST, why).into_response()
    })?;
    // Not trimmed: a signal's name is the application's text.
    let name = field(&form, "name")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad_parameter("name", "name the signal"))?;
    let payload = match field(&form, "payload").map(str::trim) {
        None | Some("") => serde_json::Value::Null,
        Some(text) => serde_json::from_str(text).map_err(|e| {
            bad_parameter("payload", &format!("{} is not JSON: {e}", excerpt(text)))
        })?,
    };
    let new = signals
        .send(id, name, payload, None)
        .await
        .map_err(|err| match err {
            // The table's signal function: no such job (no_data_found).
            Error::Database { source, .. } if has_sqlstate(&source, "P0002") => (
                StatusCode::NOT_FOUND,
                format!(
                    "no job {id} in table {}: it may have been deleted or purged; nothing was sent",
                    t.name
                ),
            )
                .into_response(),
            err => server_error(err),
        })?;
    tracing::info!(user = %viewer.user.name, table = %t.name, job = id, signal = name, new, "dashboard signal");
    let back = format!(
        "/t/{}/jobs/{id}?{}",
        url_escape(&t.name),
        super::notice::query(&s, &format!("signal {} sent", excerpt(name)))
    );
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}
