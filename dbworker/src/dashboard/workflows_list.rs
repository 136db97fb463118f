//! The workflows page: a table's workflows, newest first, each with its
//! tasks counted per state, its age and its state, filtered by state and
//! paged by a keyset cursor (`?before=ID`), each linked to its own page.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::pages::{layout, state_cell};
use super::{
    Refresh, Shared, Table, Viewer, bad_parameter, dag, refresh, server_error, url_escape,
};
use crate::job_filter::{excerpt, format_age};
use crate::workflow::{WorkflowFilter, WorkflowList, WorkflowListRequest};

/// The filter's choices, in the order shown.
const FILTERS: [(&str, &str); 6] = [
    ("", "any state"),
    ("running", "running"),
    ("finished", "finished"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("canceled", "canceled"),
];

/// The link to a table's workflows list.
pub(super) fn href(viewer: &Viewer, t: &Table) -> String {
    viewer.href(&format!("/t/{}/workflows", url_escape(&t.name)))
}

/// `GET /t/{table}/workflows`.
pub(super) async fn list(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path(table): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let Some(workflows) = &t.workflows else {
        return Err((
            StatusCode::NOT_FOUND,
            "workflow: this table has no workflows (dbworker migration --workflows)",
        )
            .into_response());
    };
    let state = q.get("state").map(|v| v.trim()).unwrap_or("");
    let filter: WorkflowFilter = state.parse().map_err(server_error)?;
    let mut request = WorkflowListRequest::first(s.options.page_size, filter);
    if let Some(before) = q.get("before").filter(|v| !v.is_empty()) {
        let not_id = |_| {
            bad_parameter(
                "before",
                &format!("{} is not a workflow id", excerpt(before)),
            )
        };
        request.before = Some(before.parse().map_err(not_id)?);
    }
    let list = workflows.list(request).await.map_err(server_error)?;
    Ok(page(&viewer, &s, t, state, &list, &refresh(&q)).into_response())
}

fn page(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    state: &str,
    list: &WorkflowList,
    refresh: &Refresh,
) -> Markup {
    let job_states: Vec<&str> = dag::STATE_COLOURS.iter().map(|(s, _)| *s).collect();
    let next = list.next.map(|n| {
        let mut link = format!("?before={n}");
        if !state.is_empty() {
            link.push_str(&format!("&state={}", url_escape(state)));
        }
        link
    });
    let body = html! {
        form class="filters" method="get" {
            select name="state" {
                @for (value, label) in FILTERS {
                    option value=(value) selected[state == value] { (label) }
                }
            }
            button type="submit" { "Filter" }
        }
        table class="workflows" {
            tr {
                th { "workflow" } th { "state" }
                @for st in &job_states { th { (state_cell(st)) } }
                th { "tasks" } th { "age" }
            }
            @for w in &list.workflows {
                tr data-workflow=(w.id) {
                    td { a href=(crate::dashboard::workflow::href(viewer, t, w.id)) { (w.id) } }
                    td { span class=(format!("workflow-{}", w.state.as_str())) { (w.state.as_str()) } }
                    @for st in &job_states {
                        td class="num" data-state=(st) { (w.counts.get(*st).copied().unwrap_or(0)) }
                    }
                    td class="num" { (w.total) }
                    td { (format_age(w.age_seconds)) }
                }
            }
        }
        @if list.workflows.is_empty() { p class="muted" { "No workflow matches." } }
        @if list.cut_short {
            p class="notice" id="cut-short" {
                "Looked at " (list.looked_at) " workflows for this page and stopped there, to answer quickly; older ones are on the next page."
            }
        }
        @if let Some(next) = next { p { a id="next-page" href=(next) { "Next page →" } } }
    };
    layout(
        viewer,
        s,
        &format!("Workflows · {}", t.name),
        Some(refresh),
        body,
    )
}
