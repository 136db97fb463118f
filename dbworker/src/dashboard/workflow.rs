//! The workflow page: a workflow's tasks counted per state and drawn as a
//! graph (`dag.rs`), each task linked to its job page; the tables that have
//! workflows found at start-up; the jobs list's workflow filter checked.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use sqlx::PgPool;

use super::pages::{layout, state_cell};
use super::{Role, Shared, Table, Viewer, dag, refresh, server_error, url_escape};
use crate::job_filter::JobFilter;
use crate::table::JobTable;
use crate::workflow::{WorkflowGraph, Workflows};

/// The most tasks drawn; a larger workflow is shown as counts and a table
/// of its first tasks (a drawing of thousands of boxes helps nobody).
pub(crate) const MAX_DRAWN: usize = 500;

/// The table's workflows, when it has them (`JobTableOptions::workflows`),
/// for reading: the dashboard never enqueues.
pub(super) fn open(pool: &PgPool, t: &JobTable) -> Option<Workflows> {
    t.has_workflows().then(|| Workflows::reader(pool, t))
}

/// Refuses a workflow filter on a table without workflows (its query would
/// name a column the table does not have).
pub(super) fn check_filter(t: &Table, f: &JobFilter) -> std::result::Result<(), Response> {
    if f.workflow_id.is_some() && t.workflows.is_none() {
        return Err((
            StatusCode::BAD_REQUEST,
            "workflow: this table has no workflows (dbworker migration --workflows)",
        )
            .into_response());
    }
    Ok(())
}

fn jobs_href(viewer: &Viewer, t: &Table, id: i64) -> String {
    viewer.href(&format!("/t/{}/jobs?workflow={id}", url_escape(&t.name)))
}

/// The link to a workflow's page.
pub(super) fn href(viewer: &Viewer, t: &Table, id: i64) -> String {
    viewer.href(&format!("/t/{}/workflows/{id}", url_escape(&t.name)))
}

/// `GET /t/{table}/workflows/{id}`.
pub(super) async fn workflow(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path((table, id)): Path<(String, i64)>,
    Query(q): Query<HashMap<String, String>>,
) -> std::result::Result<Response, Response> {
    let t = s.table(&table)?;
    let Some(workflows) = &t.workflows else {
        return Err((
            StatusCode::NOT_FOUND,
            "workflow: this table has no workflows (dbworker migration --workflows)",
        )
            .into_response());
    };
    match workflows.graph(id, MAX_DRAWN).await {
        Ok(Some(graph)) => Ok(page(&viewer, &s, t, &graph, &refresh(&q)).into_response()),
        Ok(None) => Err((StatusCode::NOT_FOUND, "no such workflow").into_response()),
        Err(err) => Err(server_error(err)),
    }
}

/// States in the legend's order, then any other.
fn ordered_counts(graph: &WorkflowGraph) -> Vec<(&str, u64)> {
    let known = dag::STATE_COLOURS.iter().map(|(s, _)| *s);
    let mut out: Vec<(&str, u64)> = known
        .filter_map(|s| graph.counts.get(s).map(|n| (s, *n)))
        .collect();
    for (s, n) in &graph.counts {
        if !dag::STATE_COLOURS.iter().any(|(k, _)| k == s) {
            out.push((s.as_str(), *n));
        }
    }
    out
}

/// The whole workflow's actions, through the bulk action on its tasks (each
/// asks for confirmation with the count first): retry its failed tasks
/// (the tasks canceled because one of them failed come back to `pending`
/// with it, `blocked_by`), or cancel it (waiting tasks now, running ones
/// through their workers).
fn actions(viewer: &Viewer, s: &Shared, t: &Table, id: i64) -> Markup {
    let bulk = viewer.href(&format!("/t/{}/bulk", url_escape(&t.name)));
    html! {
        p class="workflow-actions" {
            @for (action, state, label, class) in [
                ("requeue", Some("failed"), "Retry the workflow's failed tasks", ""),
                ("cancel", None, "Cancel the workflow", "danger"),
            ] {
                form class="inline" method="post" action=(bulk) {
                    input type="hidden" name="csrf" value=(s.csrf);
                    input type="hidden" name="action" value=(action);
                    input type="hidden" name="scope" value="matching";
                    input type="hidden" name="f_workflow" value=(id);
                    @if let Some(state) = state { input type="hidden" name="f_state" value=(state); }
                    button type="submit" id=(format!("workflow-{action}")) class=(class) { (label) }
                    " "
                }
            }
        }
    }
}

fn page(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    graph: &WorkflowGraph,
    refresh: &super::Refresh,
) -> Markup {
    let job_href = |id: i64| viewer.href(&format!("/t/{}/jobs/{id}", url_escape(&t.name)));
    let names: HashMap<i64, String> = graph.tasks.iter().map(|g| (g.id, g.label())).collect();
    let outside = graph.outside_edges();
    let body = html! {
        table class="workflow-counts" {
            tr { @for (state, _) in ordered_counts(graph) { th { (state_cell(state)) } } th { "total" } }
            tr {
                @for (state, n) in ordered_counts(graph) { td class="num" data-state=(state) { (n) } }
                td class="num" { (graph.total()) }
            }
        }
        p {
            a href=(jobs_href(viewer, t, graph.id)) { "List this workflow's jobs" } " · "
            a href=(super::workflows_list::href(viewer, t)) { "all workflows" }
        }
        @if viewer.user.role == Role::Admin {
            (actions(viewer, s, t, graph.id))
        }
        @if graph.from_edges_only {
            p class="notice" id="edges-only" {
                "This table has no " code { "upstream_ids" } " column (it was migrated with "
                code { "--workflows" } " before the column was part of it), so the dependencies "
                "already satisfied are gone: only the ones still waited for are drawn. Run "
                code { "dbworker migration --workflows" } " again to keep the whole graph of the "
                "workflows enqueued from then on."
            }
        }
        @if graph.truncated {
            p class="notice" id="not-drawn" {
                "This workflow has " (graph.total()) " tasks: more than " (MAX_DRAWN)
                " are not drawn. Its first " (graph.tasks.len()) " tasks, in id order:"
            }
            table class="workflow-tasks" {
                tr { th { "job" } th { "task" } th { "state" } th { "waits or waited for" } }
                @for task in &graph.tasks {
                    tr {
                        td { a href=(job_href(task.id)) { (task.id) } }
                        td { (task.label()) }
                        td { (state_cell(&task.state)) }
                        td {
                            @for (i, u) in task.upstream.iter().enumerate() {
                                @if i > 0 { ", " }
                                (names.get(u).cloned().unwrap_or_else(|| format!("#{u}")))
                            }
                        }
                    }
                }
            }
        } @else {
            (dag::legend())
            div class="workflow-scroll" { (dag::svg(graph, job_href)) }
            @if !outside.is_empty() {
                h2 { "Jobs outside this workflow it waits or waited for" }
                ul {
                    @for (u, d) in &outside {
                        li {
                            (names.get(d).cloned().unwrap_or_default()) " waits or waited for "
                            a href=(job_href(*u)) { "job " (u) }
                        }
                    }
                }
            }
        }
    };
    layout(
        viewer,
        s,
        &format!("Workflow {} · {}", graph.id, t.name),
        Some(refresh),
        body,
    )
}
