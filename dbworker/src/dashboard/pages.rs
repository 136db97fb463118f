//! The pages, as `maud` templates: every value is escaped on output, and
//! every action is a plain form carrying the CSRF token.

use std::collections::HashMap;

use maud::{DOCTYPE, Markup, html};
use workerutil::JobState;

use super::{Refresh, Role, Shared, Table, Viewer, charts, limits, url_escape};
use crate::admin::{FinishedCounts, QueueCounts, STATE_COLUMNS, Status, Suggestions};
use crate::cluster::nodes::NodeInfo;
use crate::control::limits::{Limit, Limits};
use crate::control::pauses::{Pause, Pauses};
use crate::job_filter::format_age;
use crate::job_filter::{BulkAction, JobPage, Matching};

/// The overview of one table.
pub(crate) struct TableOverview<'a> {
    pub(crate) name: &'a str,
    pub(crate) status: Status,
    pub(crate) paused: Vec<Pause>,
    pub(crate) charts: charts::Charts,
}

/// A page; `refresh` is `None` on pages that must not reload (a confirmation).
pub(super) fn layout(
    viewer: &Viewer,
    s: &Shared,
    title: &str,
    refresh: Option<&Refresh>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                // With script, live.js reloads instead, waiting for a form.
                @if let Some(r) = refresh.and_then(Refresh::reload) { noscript { meta http-equiv="refresh" content=(r); } }
                title { (title) " · dbworker" }
                link rel="stylesheet" href=(viewer.href("/assets/style.css"));
            }
            body {
                header {
                    @let nav = |path: String| refresh.map_or_else(|| viewer.href(&path), |r| r.carried(viewer.href(&path)));
                    a href=(nav("/".into())) { strong { "dbworker" } }
                    @for t in &s.tables {
                        a href=(nav(format!("/t/{}/jobs", url_escape(&t.name)))) { (t.name) }
                        a href=(nav(format!("/t/{}/queues", url_escape(&t.name)))) { "queues" }
                        @if t.workflows.is_some() { a href=(nav(format!("/t/{}/workflows", url_escape(&t.name)))) { "workflows" } }
                        @if t.fairness.is_some() { a href=(nav(format!("/t/{}/fairness", url_escape(&t.name)))) { "fairness" } }
                        @if s.options.cron_table.is_some() { a href=(nav(format!("/t/{}/cron", url_escape(&t.name)))) { "cron" } }
                    }
                    @if s.options.node_table.is_some() { a href=(nav("/processes".into())) { "processes" } }
                    span class="who" {
                        (viewer.user.name) " · "
                        @if viewer.user.role == Role::Admin { "admin" } @else { "read-only" }
                    }
                }
                (super::replica::line(&viewer.replica))
                main data-live=[refresh.and_then(Refresh::live)] data-reload=[refresh.and_then(Refresh::reload)] {
                    h1 { (title) }
                    @if let Some(refresh) = refresh { (refresh.bar()) }
                    (body)
                }
                script src=(viewer.href("/assets/live.js")) defer {}
            }
        }
    }
}

pub(super) fn state_cell(state: &str) -> Markup {
    html! { span class=(format!("state-{state}")) { (state) } }
}

pub(crate) fn overview(
    viewer: &Viewer,
    s: &Shared,
    tables: &[TableOverview<'_>],
    nodes: Option<&[NodeInfo]>,
    range: crate::history::Range,
    refresh: &Refresh,
) -> Markup {
    let body = html! {
        @for t in tables {
            h2 { a href=(viewer.href(&format!("/t/{}/jobs", url_escape(t.name)))) { (t.name) } }
            (state_counts(&t.status))
            p {
                "Oldest waiting job: " strong { (format_age(t.status.oldest_waiting_seconds)) }
                " · about " (t.status.estimated_rows) " rows in the table (planner estimate)"
            }
            @if !t.paused.is_empty() {
                p class="notice" {
                    "Paused: "
                    @for p in &t.paused {
                        (p.queue.as_deref().unwrap_or("the whole table")) " (by " (p.paused_by) ") "
                    }
                }
            }
            (charts::section(t.name, &t.charts, range, refresh))
        }
        @if let Some(nodes) = nodes {
            h2 { "Live processes" }
            table {
                tr { th { "process" } th { "version" } th { "queues" } th { "handlers" } th { "up" } th { "heartbeat" } }
                @for n in nodes {
                    tr {
                        td { (n.id) }
                        td { (n.version) }
                        td { (n.queues.join(", ")) }
                        td class="num" { (n.handlers) }
                        td { (format_age(n.up_seconds)) }
                        td { (format!("{:.1} s ago", n.heartbeat_age_seconds)) }
                    }
                }
            }
        }
    };
    layout(viewer, s, "Overview", Some(refresh), body)
}

/// Every state per queue and the total (`Admin::status`); finished states
/// marked when they are the planner's estimates or the history's sums.
fn state_counts(status: &Status) -> Markup {
    let heads = STATE_COLUMNS;
    let cells = |q: &QueueCounts| {
        q.in_columns()
            .map(|n| n.map_or_else(|| "–".to_owned(), |n| n.to_string()))
    };
    let estimated = status.finished == FinishedCounts::Estimated;
    let from_history = match status.finished {
        FinishedCounts::FromHistory { covered } => Some(format_age(covered.as_secs_f64())),
        _ => None,
    };
    html! {
        table class="state-counts" {
            tr { th { "queue" } @for h in heads { th { (h) } } }
            @for q in &status.queues {
                tr {
                    td { (q.queue.as_deref().unwrap_or("(all)")) }
                    @for n in cells(q) { td class="num" { (n) } }
                }
            }
            tr class="total" {
                th { "total" }
                @for n in cells(&status.total) { td class="num" { (n) } }
            }
        }
        @if let Some(period) = from_history {
            p class="muted" {
                "Completed, failed and canceled: finished in the last " (period)
                ", from the history (no index over the final states; "
                code { "dbworker migration --retention" } " adds one)."
            }
        }
        @if estimated {
            p class="muted" {
                "Completed, failed and canceled: planner estimates, in total only (no index over the final states; "
                code { "dbworker migration --retention" } " adds one)."
            }
        }
    }
}

/// `(queue, [queued, errored, processing])`, by queue; `None` (shown as
/// "(all)") for a table without a queue column, or its jobs whose queue is
/// NULL.
fn by_queue(status: &Status) -> Vec<(Option<String>, [u64; 3])> {
    status
        .per_queue()
        .into_iter()
        .map(|q| (q.queue, [q.queued, q.errored, q.processing]))
        .collect()
}

/// The live queues, plus paused or limited ones with no live job.
fn with_idle_queues(
    mut rows: Vec<(Option<String>, [u64; 3])>,
    paused: &[Pause],
    limits: &[(String, Limit)],
) -> Vec<(Option<String>, [u64; 3])> {
    let named = paused
        .iter()
        .filter_map(|p| p.queue.clone())
        .chain(limits.iter().map(|(q, _)| q.clone()));
    for q in named {
        if !rows.iter().any(|r| r.0.as_ref() == Some(&q)) {
            rows.push((Some(q), [0; 3]));
        }
    }
    rows.sort();
    rows
}

/// What a hidden column's cell shows (as the job page shows a hidden field).
const HIDDEN: &str = "[hidden]";

fn hidden_filters(q: &HashMap<String, String>) -> Markup {
    html! {
        @for key in ["state", "queue", "kind", "older_than_secs", "failure", "field", "workflow"] {
            @if let Some(v) = q.get(key) {
                input type="hidden" name=(format!("f_{key}")) value=(v);
            }
        }
    }
}

pub(crate) fn jobs(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    q: &HashMap<String, String>,
    page: &JobPage,
    suggest: &Suggestions,
    refresh: &Refresh,
) -> Markup {
    let value = |k: &str| q.get(k).cloned().unwrap_or_default();
    let admin = viewer.user.role == Role::Admin;
    let hidden = super::HiddenColumns::of(t, &s.options.hidden_fields);
    let newest = super::newest_first(q);
    let mut next = format!("?after={}", page.next.unwrap_or_default());
    if let Some(value) = &page.next_value {
        next.push_str(&format!("&after_value={}", url_escape(value)));
    }
    for (k, v) in q
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "after" | "after_value" | "done" | "sig"))
    {
        next.push_str(&format!("&{}={}", url_escape(k), url_escape(v)));
    }
    let workflow = q.get("workflow").and_then(|w| w.trim().parse::<i64>().ok());
    let body = html! {
        @if let Some(done) = super::notice::of(s, q) { p class="notice" { "Done: " (done) } }
        @if let Some(w) = workflow {
            p { "The tasks of workflow " (w) " · " a id="workflow-link" href=(crate::dashboard::workflow::href(viewer, t, w)) { "see its graph" } }
        }
        // Straight to a job by its id (the list's handler redirects).
        form class="filters goto" method="get" {
            input name="id" type="number" min="1" placeholder="job id" size="10";
            button type="submit" id="go-to-job" { "Open" }
        }
        @if !hidden.queue { datalist id="queues" { @for v in &suggest.queues { option value=(v) {} } } }
        @if !hidden.kind { datalist id="kinds" { @for v in &suggest.kinds { option value=(v) {} } } }
        form class="filters" method="get" {
            select name="state" {
                option value="" { "any state" }
                // Every state, so none (pending) is missing from the list.
                @for st in JobState::ALL.map(JobState::as_str) {
                    option value=(st) selected[value("state") == st] { (st) }
                }
            }
            @if t.admin.queue_column().is_some() && !hidden.queue {
                input name="queue" list="queues" placeholder="queue" value=(value("queue"));
            }
            @if t.admin.kind_column().is_some() && !hidden.kind {
                input name="kind" list="kinds" placeholder="kind" value=(value("kind"));
            }
            input name="older_than_secs" placeholder="older than (s)" size="10" value=(value("older_than_secs"));
            @if !hidden.failure {
                input name="failure" placeholder="failure contains" value=(value("failure"));
            }
            input name="field" placeholder="payload.customer_id=42" value=(value("field"));
            @if t.workflows.is_some() {
                input name="workflow" placeholder="workflow id" size="10" value=(value("workflow"));
            }
            select name="sort" {
                @for (sort, label) in [("id", "by id"), ("queued_at", "by queued time"), ("finished_at", "by finish time"), ("failures", "by failures")] {
                    option value=(sort) selected[value("sort") == sort] { (label) }
                }
            }
            select name="order" {
                option value="oldest" selected[!newest] { "ascending" }
                option value="newest" selected[newest] { "descending" }
            }
            button type="submit" { "Filter" }
        }
        form method="post" action=(viewer.href(&format!("/t/{}/bulk", url_escape(&t.name)))) {
            // The token only for admins: a reader has no action to take, and
            // holding it could forge an admin's post from another page (only
            // the same-origin check would stand).
            @if admin { input type="hidden" name="csrf" value=(s.csrf); }
            (hidden_filters(q))
            table {
                tr {
                    @if admin { th {} }
                    th { "id" } th { "state" } th { "queue" } th { "kind" }
                    @if t.workflows.is_some() { th { "workflow" } }
                    th { "failures" } th { "age" } th { "host" } th { "failure" }
                }
                @for j in &page.jobs {
                    tr {
                        @if admin { td { input type="checkbox" name="id" value=(j.id); } }
                        td { a href=(viewer.href(&format!("/t/{}/jobs/{}", url_escape(&t.name), j.id))) { (j.id) } }
                        td { (state_cell(j.state.as_str())) }
                        td { @if hidden.queue { (HIDDEN) } @else { (j.queue.as_deref().unwrap_or("-")) } }
                        td { @if hidden.kind { (HIDDEN) } @else { (j.kind.as_deref().unwrap_or("-")) } }
                        @if t.workflows.is_some() {
                            td {
                                @if let Some(w) = j.workflow_id {
                                    a class="workflow" href=(crate::dashboard::workflow::href(viewer, t, w)) { (w) }
                                } @else { "-" }
                            }
                        }
                        td class="num" { (j.num_failures) }
                        td { (format_age(j.age_seconds)) }
                        td { @if hidden.host { (HIDDEN) } @else { (j.worker_hostname) } }
                        td { @if hidden.failure { (HIDDEN) } @else { (j.failure_message.as_deref().unwrap_or("")) } }
                    }
                }
            }
            @if let (Some(rows), Some(to)) = (page.searched, page.next) {
                p class="muted" id="searched" {
                    "Searched " (rows) " rows down to id " (to) ", no more matches yet: "
                    a href=(next) { "search on →" }
                }
            } @else {
                @if page.jobs.is_empty() { p class="muted" { "No job matches." } }
                @if page.next.is_some() { p { a href=(next) { "Next page →" } } }
            }
            @if admin {
                p {
                    select name="action" {
                        option value="requeue" { "Retry" }
                        option value="cancel" { "Cancel" }
                        option value="fail" { "Fail" }
                        option value="delete" { "Delete" }
                        option value="complete" { "Complete" }
                        option value="reschedule" { "Reschedule" }
                    }
                    " "
                    input type="number" name="run_in_secs" min="0" step="any" placeholder="reschedule: run in (s)" title="Reschedule: seconds from now (empty: keep the run-at)";
                    " "
                    button type="submit" name="scope" value="selected" { "on the selected jobs" }
                    " "
                    button type="submit" name="scope" value="matching" class="danger" { "on every job matching the filter" }
                }
            }
        }
    };
    layout(
        viewer,
        s,
        &format!("Jobs · {}", t.name),
        Some(refresh),
        body,
    )
}

/// What a bulk action's confirmation shows and posts again.
pub(crate) struct Confirm<'a> {
    /// The form as posted (its fields are posted again).
    pub(crate) form: &'a [(String, String)],
    pub(crate) action: &'a BulkAction,
    pub(crate) matching: Matching,
    /// The first jobs it would touch, by id.
    pub(crate) first: &'a [i64],
    pub(crate) all_matching: bool,
}

pub(crate) fn confirm(viewer: &Viewer, s: &Shared, t: &Table, c: &Confirm<'_>) -> Markup {
    let (action, matching, all_matching) = (c.action, c.matching, c.all_matching);
    let count = matching.count;
    let job = |id: &i64| viewer.href(&format!("/t/{}/jobs/{id}", url_escape(&t.name)));
    let body = html! {
        p class="notice" {
            strong { (action.verb()) " " (count) " job(s)" }
            @if all_matching {
                " — every job matching the filter, in batches of 500"
                @if let Some(max) = matching.max_id { " (none enqueued after job " (max) ")" }
            } @else { " — the selected jobs" }
            ". Jobs in a state the action may not touch are left alone."
        }
        @if !c.first.is_empty() {
            p id="confirm-ids" {
                @if (c.first.len() as u64) < count { "The first " (c.first.len()) ": " } @else { "Jobs: " }
                @for (i, id) in c.first.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href=(job(id)) { (id) }
                }
                @if (c.first.len() as u64) < count { ", …" }
            }
        }
        form method="post" action=(viewer.href(&format!("/t/{}/bulk", url_escape(&t.name)))) {
            @for (k, v) in c.form {
                @if !matches!(k.as_str(), "confirm" | "max_id" | "confirmed") {
                    input type="hidden" name=(k) value=(v);
                }
            }
            // The action stops at the last job counted here.
            @if all_matching {
                input type="hidden" name="max_id" value=(matching.max_id.map(|id| id.to_string()).unwrap_or_default());
            }
            // What the result is compared with.
            input type="hidden" name="confirmed" value=(count);
            input type="hidden" name="confirm" value="yes";
            button type="submit" class="danger" { "Yes, " (action.verb()) " " (count) " job(s)" }
            " "
            a href=(viewer.href(&format!("/t/{}/jobs", url_escape(&t.name)))) { "Back" }
        }
    };
    layout(viewer, s, "Confirm", None, body)
}

#[allow(clippy::too_many_arguments)] // the page's parts, each used once
pub(crate) fn queues(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    status: &Status,
    paused: &[Pause],
    limits: &[(String, Limit)],
    done: Option<&str>,
    refresh: &Refresh,
) -> Markup {
    let admin = viewer.user.role == Role::Admin && t.pauses.is_some();
    let edit_limits = viewer.user.role == Role::Admin && t.limits.is_some();
    // Without a queue column the one row stands for every queue ("(all)"):
    // a pause or a limit named after it would act on nothing.
    let pause_queues = admin && t.pauses.as_ref().is_some_and(Pauses::has_queues);
    let limit_rows = edit_limits && t.limits.as_ref().is_some_and(Limits::has_queues);
    let pause_url = viewer.href(&format!("/t/{}/queues/pause", url_escape(&t.name)));
    let is_paused = |q: Option<&str>| paused.iter().any(|p| p.queue.as_deref() == q);
    let limit_of = |q: &str| limits.iter().find(|(name, _)| name == q).map(|(_, l)| l);
    let pause_form = |queue: Option<&str>| {
        let resume = is_paused(queue);
        html! {
            form class="inline" method="post" action=(pause_url) {
                input type="hidden" name="csrf" value=(s.csrf);
                @match queue {
                    Some(q) => { input type="hidden" name="queue" value=(q); }
                    None => { input type="hidden" name="scope" value="table"; }
                }
                input type="hidden" name="do" value=(if resume { "resume" } else { "pause" });
                button type="submit" class=@if !resume { "danger" } {
                    @if resume { "Resume" } @else { "Pause" }
                    @if queue.is_none() { " the table" }
                }
            }
        }
    };
    let body = html! {
        @if let Some(done) = done { p class="notice" { "Done: " (done) } }
        p {
            "The whole table: "
            @if is_paused(None) { strong { "paused" } } @else { "running" }
            " "
            @if admin { (pause_form(None)) }
        }
        table {
            tr { th { "queue" } th { "queued" } th { "errored" } th { "processing" } th { "state" } th { "limits" } @if admin { th {} } }
            @for (queue, counts) in with_idle_queues(by_queue(status), paused, limits) {
                // The "(all)" row (no queue column, or jobs whose queue is
                // NULL): no queue's pause or limit holds its jobs, only a
                // pause of the whole table, which its button is.
                @let queue = queue.as_deref();
                tr {
                    td { (queue.unwrap_or("(all)")) }
                    @for n in counts { td class="num" { (n) } }
                    td { @if is_paused(queue) { strong { "paused" } } @else { "running" } }
                    td {
                        @match queue {
                            Some(q) => {
                                (limits::describe(&limit_of(q).copied().unwrap_or_default()))
                                @if limit_rows { br; (limits::form(viewer, s, t, Some(q), limit_of(q))) }
                            }
                            None => { span class="muted" { "none (no queue's limit holds these jobs)" } }
                        }
                    }
                    @if admin { td { @if pause_queues || queue.is_none() { (pause_form(queue)) } } }
                }
            }
        }
        @if edit_limits { p { "Limit another queue: " (limits::form(viewer, s, t, None, None)) } }
        @if t.pauses.is_none() { p class="muted" { "Pausing needs the pause table in the dashboard's table options." } }
        @if t.limits.is_none() { p class="muted" { "Limits need the limit table in the dashboard's table options." } }
    };
    layout(
        viewer,
        s,
        &format!("Queues · {}", t.name),
        Some(refresh),
        body,
    )
}
