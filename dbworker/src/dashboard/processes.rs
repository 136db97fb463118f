//! The processes page: every process the worker registry holds, with its
//! heartbeat age flagged when stale or dead, and, with the lease table, the
//! scopes each one leads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::pages::layout;
use super::{Refresh, Shared, Viewer, refresh, server_error};
use crate::cluster::leader::{Lease, leases};
use crate::cluster::nodes::{NodeInfo, registered_nodes};
use crate::job_filter::format_age;

/// How a process's heartbeat looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    /// Heartbeat younger than half of `dead_after`.
    Live,
    /// Older than half of `dead_after`: heartbeats are being missed.
    Stale,
    /// Older than `dead_after`: taken for dead (its jobs are requeued by a
    /// resetter that knows the registry); listed until pruned.
    Dead,
}

impl Health {
    pub(crate) fn of(heartbeat_age_seconds: f64, dead_after: Duration) -> Health {
        let dead = dead_after.as_secs_f64();
        if heartbeat_age_seconds > dead {
            Health::Dead
        } else if heartbeat_age_seconds > dead / 2.0 {
            Health::Stale
        } else {
            Health::Live
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Health::Live => "live",
            Health::Stale => "stale",
            Health::Dead => "dead",
        }
    }
}

/// `GET /processes`.
pub(super) async fn processes(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let Some(node_table) = &s.options.node_table else {
        return Err((
            StatusCode::NOT_FOUND,
            "no worker registry: set DashboardOptions::node_table (dbworker ui --node-table)",
        )
            .into_response());
    };
    let nodes = registered_nodes(s.reads(), node_table)
        .await
        .map_err(server_error)?;
    let leases = match &s.options.leader_table {
        Some(lt) => Some(leases(s.reads(), lt).await.map_err(server_error)?),
        None => None,
    };
    Ok(page(&viewer, &s, &nodes, leases.as_deref(), &refresh(&q)).into_response())
}

fn page(
    viewer: &Viewer,
    s: &Shared,
    nodes: &[NodeInfo],
    leases: Option<&[Lease]>,
    refresh: &Refresh,
) -> Markup {
    let dead_after = s.options.dead_after;
    let leads = |id: &str| -> Vec<&str> {
        leases
            .unwrap_or_default()
            .iter()
            .filter(|l| l.held && l.node_id == id)
            .map(|l| l.scope.as_str())
            .collect()
    };
    let live = nodes
        .iter()
        .filter(|n| Health::of(n.heartbeat_age_seconds, dead_after) != Health::Dead)
        .count();
    let body = html! {
        p {
            strong id="live-count" { (live) } " live of " (nodes.len()) " registered · stale after "
            (format_age(dead_after.as_secs_f64() / 2.0)) " without a heartbeat, dead after "
            (format_age(dead_after.as_secs_f64()))
        }
        @if nodes.is_empty() { p class="muted" { "No process is registered." } }
        @else {
            table class="processes" {
                tr {
                    th { "process" } th { "health" } th { "heartbeat" } th { "leads" }
                    th { "host" } th { "pid" } th { "version" } th { "queues" } th { "handlers" } th { "up" } th { "honours" }
                }
                @for n in nodes {
                    @let health = Health::of(n.heartbeat_age_seconds, dead_after);
                    tr data-health=(health.as_str()) {
                        td { (n.id) }
                        td { span class=(format!("health-{}", health.as_str())) { (health.as_str()) } }
                        td class="num" { (format!("{:.1} s ago", n.heartbeat_age_seconds)) }
                        td { @for (i, scope) in leads(&n.id).iter().enumerate() { @if i > 0 { ", " } strong { "leader" } " of " (scope) } }
                        td { (n.host) }
                        td class="num" { (n.pid) }
                        td { (n.version) }
                        td { (n.queues.join(", ")) }
                        td class="num" { (n.handlers) }
                        td { (format_age(n.up_seconds)) }
                        td class="honours" {
                            @match &n.honours {
                                Some(h) if h.is_empty() => span class="muted" { "no pause or limit table" },
                                Some(h) => (h.join(", ")),
                                None => span class="muted" title="a process of a version before the registry recorded it: its workers may ignore pauses and limits" { "unknown" },
                            }
                        }
                    }
                }
            }
        }
        @match leases {
            Some(leases) => {
                h2 { "Leaders" }
                @if leases.is_empty() { p class="muted" { "No scope has been led yet." } }
                @else {
                    table class="leases" {
                        tr { th { "scope" } th { "node" } th { "term" } th { "lease" } }
                        @for l in leases {
                            tr {
                                td { (l.scope) }
                                td { (l.node_id) }
                                td class="num" { (l.term) }
                                td { @if l.held { strong { "held" } } @else { span class="muted" { "expired: no leader" } } }
                            }
                        }
                    }
                }
            }
            None => { p class="muted" { "Set DashboardOptions::leader_table to see which process leads." } }
        }
    };
    layout(viewer, s, "Processes", Some(refresh), body)
}
