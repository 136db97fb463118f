//! A queue's limits on the queues page: shown to everyone, edited by an
//! admin through a form (set, change, remove) that goes through the table's
//! [`Limits`](crate::control::limits::Limits) service, so a worker's next
//! claim obeys the new limit.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::actions::AdminForm;
use super::{Shared, Table, Viewer, server_error, url_escape};
use crate::control::limits::Limit;

/// A limit as text: `at most 3 processing · 1 per key · 10/s (burst 20)`.
pub(super) fn describe(l: &Limit) -> Markup {
    let mut parts = Vec::new();
    if let Some(m) = l.max_processing {
        parts.push(format!("at most {m} processing"));
    }
    if let Some(m) = l.max_per_key {
        parts.push(format!("{m} per key"));
    }
    if let Some(r) = l.rate_per_second {
        match l.burst {
            Some(b) => parts.push(format!("{r}/s (burst {b})")),
            None => parts.push(format!("{r}/s")),
        }
    }
    html! {
        @if parts.is_empty() { span class="muted" { "none" } } @else { (parts.join(" · ")) }
    }
}

fn number<T: ToString>(n: Option<T>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

/// The admin's form for one queue's limits (`queue` `None`: a form that
/// names the queue, to limit one not listed). Empty fields mean no such
/// limit.
pub(super) fn form(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    queue: Option<&str>,
    limit: Option<&Limit>,
) -> Markup {
    let url = viewer.href(&format!("/t/{}/queues/limit", url_escape(&t.name)));
    let per_key = t.admin.table().limit_key_column.is_some();
    let l = limit.copied().unwrap_or_default();
    html! {
        form class="inline limit" method="post" action=(url) {
            input type="hidden" name="csrf" value=(s.csrf);
            @match queue {
                Some(q) => { input type="hidden" name="queue" value=(q); }
                None => { input name="queue" placeholder="queue" size="10" required; " " }
            }
            input type="number" name="max_processing" min="0" size="4" placeholder="max" title="At most this many processing at once (0 stops the queue)" value=(number(l.max_processing));
            @if per_key {
                " " input type="number" name="max_per_key" min="1" size="4" placeholder="per key" title="At most this many processing at once per key" value=(number(l.max_per_key));
            }
            " " input type="number" name="rate_per_second" min="0" step="any" size="5" placeholder="per s" title="At most this many started per second" value=(number(l.rate_per_second));
            " " input type="number" name="burst" min="1" size="4" placeholder="burst" title="Starts saved up while idle (with a rate)" value=(number(l.burst));
            " " button type="submit" name="do" value="set" { "Set limit" }
            @if limit.is_some() {
                " " button type="submit" name="do" value="remove" class="danger" { "Remove" }
            }
        }
    }
}

/// Reads an optional field; the error names it and quotes the input.
fn parse<T: std::str::FromStr>(
    form: &[(String, String)],
    key: &'static str,
    what: &str,
) -> Result<Option<T>, Response> {
    let Some(text) = super::actions::field(form, key)
        .map(str::trim)
        .filter(|v| !v.is_empty())
    else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|_| {
        super::bad_parameter(
            key,
            &format!("{} is not {what}", crate::job_filter::excerpt(text)),
        )
    })
}

/// `POST /t/{table}/queues/limit`: sets (`do=set`) or removes (`do=remove`)
/// a queue's limits. A set with every field empty removes them.
pub(super) async fn set(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path(table): Path<String>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let limits = t.limits.as_ref().ok_or_else(|| {
        (StatusCode::BAD_REQUEST, "this table has no limit table").into_response()
    })?;
    // Taken exactly, as pauses take it: setting refuses whitespace at an end.
    let queue = super::actions::field(&form, "queue")
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| super::bad_parameter("queue", "name the queue"))?;
    let limit = Limit {
        max_processing: parse(&form, "max_processing", "a whole number")?,
        max_per_key: parse(&form, "max_per_key", "a whole number")?,
        rate_per_second: parse(&form, "rate_per_second", "a number")?,
        burst: parse(&form, "burst", "a whole number")?,
    };
    if limit.max_per_key.is_some() && t.admin.table().limit_key_column.is_none() {
        return Err(super::bad_parameter(
            "max_per_key",
            "this table has no limit key column (JobTableOptions::limit_key_column)",
        ));
    }
    let remove = super::actions::field(&form, "do") == Some("remove") || limit == Limit::default();
    let done = if remove {
        limits.remove(queue).await.map_err(server_error)?;
        "limit removed"
    } else {
        limits.set_limit(queue, limit).await.map_err(server_error)?;
        "limit set"
    };
    tracing::info!(user = %viewer.user.name, table = %t.name, queue, ?limit, remove, "dashboard limit");
    let back = format!(
        "/t/{}/queues?{}",
        url_escape(&t.name),
        super::notice::query(&s, &format!("{done} on {queue}"))
    );
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}
