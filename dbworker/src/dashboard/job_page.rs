//! The job page, ordered as an operator reads it: what the job is and where
//! it stands (state, kind, queue, attempts, and the progress its handler
//! reports on a table with progress; what it waits for, with a form that
//! sends it, on a table with signals), when things happened (relative
//! to the database clock, and absolute), what went wrong (the failure, the
//! error history), what it was given and gave back (payload and result,
//! indented), its execution logs; every other column after.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::{Map, Value};

use super::pages::{layout, state_cell};
use super::timeline::{self, when};
use super::{Refresh, Role, Shared, Table, Viewer, hide, refresh, server_error, url_escape};

/// `GET /t/{table}/jobs/{id}`.
pub(super) async fn job(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path((table, id)): Path<(String, i64)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    match t.admin.show_at(id).await {
        Ok(Some((mut row, now))) => {
            hide(&mut row, &s.options.hidden_fields);
            hide_attempts(t, &s.options.hidden_fields, &mut row);
            let done = super::notice::of(&s, &q);
            Ok(page(&viewer, &s, t, id, &row, now, done, &refresh(&q)).into_response())
        }
        Ok(None) => Err((StatusCode::NOT_FOUND, "no such job").into_response()),
        Err(err) => Err(server_error(err)),
    }
}

/// The error history repeats the failure message and the worker's host of
/// each attempt: hidden with their columns.
fn hide_attempts(t: &Table, hidden: &[String], row: &mut Value) {
    let columns = super::HiddenColumns::of(t, hidden);
    let Some(history) = t.error_history.as_deref() else {
        return;
    };
    let Some(Value::Array(entries)) = row.get_mut(history) else {
        return;
    };
    for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
        for (key, is_hidden) in [("message", columns.failure), ("worker", columns.host)] {
            if is_hidden && entry.contains_key(key) {
                entry.insert(key.into(), Value::String("[hidden]".into()));
            }
        }
    }
}

/// A column's value: JSON indented, text as text.
fn value_cell(value: &Value) -> Markup {
    html! {
        @if value.is_object() || value.is_array() {
            pre { (serde_json::to_string_pretty(value).unwrap_or_default()) }
        } @else if let Some(text) = value.as_str() {
            (text)
        } @else if value.is_null() {
            span class="muted" { "–" }
        } @else {
            (value.to_string())
        }
    }
}

/// The configured name of an optional column, or the conventional one when
/// the row has it (a table whose options leave the column undeclared).
fn optional<'a>(
    configured: Option<&'a str>,
    conventional: &'a str,
    row: &Map<String, Value>,
) -> Option<&'a str> {
    configured.or_else(|| row.contains_key(conventional).then_some(conventional))
}

#[allow(clippy::too_many_arguments)] // the page's parts, each used once
fn page(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    id: i64,
    row: &Value,
    now: f64,
    done: Option<&str>,
    refresh: &Refresh,
) -> Markup {
    let columns = row.as_object().cloned().unwrap_or_default();
    let sql = t.admin.table();
    let c = &sql.columns;
    let get = |name: &str| columns.get(name).cloned().unwrap_or(Value::Null);
    let text = |name: &str| get(name).as_str().map(str::to_owned);
    let state = text(&c.state).unwrap_or_default();
    let kind = optional(sql.kind_column.as_deref(), "kind", &columns);
    let queue = optional(sql.queue_column.as_deref(), "queue", &columns);
    let max_retries = sql.max_retries_column.as_deref();
    let payload = optional(sql.payload_column.as_deref(), "payload", &columns);
    let result = optional(sql.result_column.as_deref(), "result", &columns);
    let history = t.error_history.as_deref();
    // Only where the table keeps it (`dbworker migration --progress`, or
    // `--progress-table`: the side table's value is in the row as shown).
    let progress = sql.keeps_progress().then_some(crate::columns::PROGRESS);
    let awaiting_column = sql.signals.as_ref().map(|_| crate::columns::AWAITING);
    // Only a job that waits (queued or errored) can be woken by its signal.
    let waiting = ["queued", "errored"].contains(&state.as_str());
    let awaiting = awaiting_column.and_then(&text).filter(|_| waiting);
    let entries = history
        .and_then(|h| columns.get(h))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let workflow = columns
        .get(crate::columns::WORKFLOW_ID)
        .and_then(Value::as_i64)
        .filter(|_| t.workflows.is_some());
    let times = [
        ("queued", c.queued_at.as_str()),
        ("runs after", c.process_after.as_str()),
        ("started", c.started_at.as_str()),
        ("last heartbeat", c.last_heartbeat_at.as_str()),
        ("finished", c.finished_at.as_str()),
    ];
    // Shown above: every column the sections name; the rest follow.
    let mut shown: Vec<&str> = vec![
        &c.id,
        &c.state,
        &c.num_failures,
        &c.num_resets,
        &c.failure_message,
        &c.execution_logs,
        &c.worker_hostname,
    ];
    shown.extend(times.iter().map(|(_, col)| *col));
    shown.extend(
        [
            kind,
            queue,
            max_retries,
            payload,
            result,
            history,
            progress,
            awaiting_column,
        ]
        .into_iter()
        .flatten(),
    );
    let action_url = viewer.href(&format!("/t/{}/jobs/{id}/action", url_escape(&t.name)));
    let logs = get(&c.execution_logs);
    let failure = text(&c.failure_message).filter(|m| !m.is_empty());
    let body = html! {
        @if let Some(done) = done { p class="notice" { "Done: " (done) } }
        p { "State: " strong { (state_cell(&state)) } }
        @if let Some(w) = workflow {
            p { "Task of " a id="workflow-link" href=(crate::dashboard::workflow::href(viewer, t, w)) { "workflow " (w) } }
        }
        @if viewer.user.role == Role::Admin {
            p {
                @for (action, label) in [("requeue", "Retry now"), ("cancel", "Cancel"), ("fail", "Fail"), ("complete", "Complete")] {
                    form class="inline" method="post" action=(action_url) {
                        input type="hidden" name="csrf" value=(s.csrf);
                        input type="hidden" name="action" value=(action);
                        button type="submit" class=@if action != "requeue" { "danger" } { (label) }
                        " "
                    }
                }
            }
        }
        table class="job-summary" {
            tr { th { "state" } td { (state_cell(&state)) } }
            @if let Some(k) = kind { tr { th { "kind" } td { (value_cell(&get(k))) } } }
            @if let Some(q) = queue { tr { th { "queue" } td { (value_cell(&get(q))) } } }
            tr {
                th { "attempts" }
                td id="attempts" {
                    (get(&c.num_failures).as_i64().unwrap_or(0))
                    @if let Some(max) = max_retries.and_then(|m| get(m).as_i64()) { "/" (max) " failures (num_failures/max retries)" }
                    @else { " failures " span class="muted" { "(the workers' max_num_retries applies)" } }
                    @if let Some(resets) = get(&c.num_resets).as_i64().filter(|r| *r > 0) { " · " (resets) " reset(s)" }
                }
            }
            tr { th { "worker" } td { (value_cell(&get(&c.worker_hostname))) } }
        }
        @if let Some(column) = progress {
            h2 { "Progress" }
            div id="progress" {
                @if get(column).is_null() { p class="muted" { "None reported." } }
                @else { (value_cell(&get(column))) }
            }
        }
        @if let Some(signal) = &awaiting {
            h2 { "Waiting for a signal" }
            p id="awaiting" {
                "Waits for the signal " code { (signal) } ": it runs again as soon as the signal is sent, "
                "or once its wait is over (runs after: " (when(&get(&c.process_after), now)) ")."
            }
            @if viewer.user.role == Role::Admin { (super::signal::form(viewer, s, t, id, signal)) }
        }
        h2 { "Timeline" }
        (timeline::timeline(&timeline::Facts {
            state: &state,
            queued_at: get(&c.queued_at),
            started_at: get(&c.started_at),
            finished_at: get(&c.finished_at),
            worker: get(&c.worker_hostname).as_str().unwrap_or(""),
            failure: failure.as_deref(),
            attempts: &entries,
        }, now))
        h2 { "Times" }
        table class="job-times" {
            @for (label, col) in times {
                tr { th { (label) } td { (when(&get(col), now)) } }
            }
        }
        h2 { "Errors" }
        @if let Some(message) = &failure { pre class="failure" { (message) } }
        @else { p class="muted" { "No failure message." } }
        @if history.is_some() {
            h3 { "Error history" }
            @if entries.is_empty() { p class="muted" { "No failed attempt." } }
            @else {
                table class="error-history" {
                    tr { th { "Attempt" } th { "At" } th { "Worker" } th { "Message" } }
                    @for e in &entries {
                        tr {
                            td { (e["attempt"]) }
                            td { (when(&e["at"], now)) }
                            td { (e["worker"].as_str().unwrap_or("")) }
                            td { pre { (e["message"].as_str().unwrap_or("")) } }
                        }
                    }
                }
            }
        }
        @if let Some(p) = payload { h2 { "Payload" } div id="payload" { (value_cell(&get(p))) } }
        @if let Some(r) = result { h2 { "Result" } div id="result" { (value_cell(&get(r))) } }
        h2 { "Execution logs" }
        @if logs.is_null() { p class="muted" { "None." } }
        @else { pre { (serde_json::to_string_pretty(&logs).unwrap_or_default()) } }
        h2 { "Other columns" }
        table class="job-columns" {
            @for (name, value) in &columns {
                @if !shown.contains(&name.as_str()) {
                    tr { th { (name) } td { (value_cell(value)) } }
                }
            }
        }
    };
    layout(
        viewer,
        s,
        &format!("Job {id} · {}", t.name),
        Some(refresh),
        body,
    )
}
