//! The web dashboard: an `axum` router an application mounts under a path of
//! its choice, or `dbworker ui` serves alone.
//!
#![doc = include_str!("../../docs/modules/dashboard.md")]
// Early returns from handlers are ready responses; boxing them buys nothing.
#![allow(clippy::result_large_err)]

mod actions;
mod auth;
mod charts;
mod cron;
mod dag;
mod fairness;
mod filter;
mod grants;
mod job_page;
mod limits;
mod notice;
mod pages;
mod processes;
mod refresh;
mod replica;
mod signal;
mod suggest;
mod timeline;
mod workflow;
mod workflows_list;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sqlx::PgPool;

pub use auth::{Auth, AuthHook, BasicUser, Role, User};
pub(crate) use filter::{HiddenColumns, filter_from, newest_first};
pub(crate) use refresh::{Refresh, refresh};

use crate::admin::Admin;
use crate::control::FairWeights;
use crate::control::limits::{Limit, Limits};
use crate::control::pauses::{Pauses, PausesOptions};
use crate::error::{Error, Result};
use crate::job_filter::{PageRequest, excerpt};
use crate::table::JobTable;

/// What the dashboard shows and who may see it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DashboardOptions {
    /// The job tables, in the order shown (each by its [`JobTable::name`] in
    /// URLs). A table's pause and limit tables give the queues page its
    /// pause buttons and limits; fair claims, a fairness page with each
    /// key's weight; its error history column, the job page's table of
    /// failed attempts.
    pub tables: Vec<JobTable>,
    /// How users are authenticated (default: nobody is asked; see [`Auth::None`]).
    pub auth: Auth,
    /// JSON fields (at any depth) and columns whose values are never shown
    /// nor filtered on: secrets in payloads.
    pub hidden_fields: Vec<String>,
    /// The worker registry, to list live processes (the overview) and every
    /// registered one with its health (the processes page).
    pub node_table: Option<String>,
    /// The lease table of leader election, to show which process leads
    /// each scope (the processes page).
    pub leader_table: Option<String>,
    /// The cron table (`dbworker migration --cron`), for each table's cron
    /// page (schedules, last and next tick, the job last enqueued).
    pub cron_table: Option<String>,
    /// A process whose registry heartbeat is older than this is dead: the
    /// overview does not list it, the processes page flags it (and flags it
    /// stale past half of it). Default 10 s, the registry's own default.
    pub dead_after: Duration,
    /// The history table the overview's charts read (written by
    /// [`History`](crate::history::History)); when it does not exist the
    /// overview says how to create it. Default
    /// [`DEFAULT_HISTORY_TABLE`](crate::history::DEFAULT_HISTORY_TABLE).
    pub history_table: String,
    /// Jobs per page. Default 50.
    pub page_size: u32,
    /// Show no actions to anyone, whatever their [`Role`]: the dashboard then
    /// needs only `SELECT` (on the job table, its view, pause, limit,
    /// weight and dependency tables). Default `false`: actions are offered
    /// to admins, and [`Dashboard::new`] checks the grants they use, refusing
    /// to start without them (naming each `GRANT`, or this option).
    pub read_only: bool,
    /// A pool on a streaming replica of the database: the pages' job lists,
    /// counts, job rows, workflows and charts are read from it, and every
    /// page says how far behind it is; actions, pauses, limits and fair
    /// weights (with each key's work) stay on the primary (the pool given to
    /// [`Dashboard::new`]). Default `None`: all on the primary.
    pub replica: Option<PgPool>,
}

impl DashboardOptions {
    /// A dashboard over `tables` with defaults.
    pub fn new(tables: Vec<JobTable>) -> DashboardOptions {
        DashboardOptions {
            tables,
            auth: Auth::None,
            hidden_fields: Vec::new(),
            node_table: None,
            leader_table: None,
            cron_table: None,
            dead_after: Duration::from_secs(10),
            history_table: crate::history::DEFAULT_HISTORY_TABLE.to_owned(),
            page_size: 50,
            read_only: false,
            replica: None,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.tables.is_empty() {
            return invalid("tables", "name at least one job table");
        }
        // URLs name a table by its name: a second of one name is unreachable.
        for (i, t) in self.tables.iter().enumerate() {
            if self.tables[..i].iter().any(|u| u.name() == t.name()) {
                return invalid(
                    "tables",
                    &format!(
                        "two tables are named {:?}; the second would be unreachable",
                        t.name()
                    ),
                );
            }
        }
        crate::columns::Relation::parse("history_table", &self.history_table)?;
        // Parsed where pages read them: a bad name would list no process.
        for (field, name) in [
            ("node_table", &self.node_table),
            ("leader_table", &self.leader_table),
        ] {
            if let Some(name) = name {
                crate::columns::Relation::parse(field, name)?;
            }
        }
        Error::check_max_durations([("dead_after", self.dead_after)])?;
        if self.page_size == 0 {
            return invalid("page_size", "must be at least 1");
        }
        Ok(())
    }
}

/// One table's admin and what belongs to it.
pub(crate) struct Table {
    pub(crate) name: String,
    /// For reading: on the replica when there is one.
    pub(crate) admin: Admin,
    /// For actions: on the primary.
    pub(crate) writer: Admin,
    pub(crate) pauses: Option<Pauses>,
    pub(crate) limits: Option<Limits>,
    /// The weights of a fair table's keys, on the primary.
    pub(crate) fairness: Option<FairWeights>,
    /// The sender of a table with signals, on the primary.
    pub(crate) signals: Option<crate::Signals>,
    /// The error history column, unquoted, if the table keeps one.
    pub(crate) error_history: Option<String>,
    /// The table's workflows, if it has them (`--workflows`).
    pub(crate) workflows: Option<crate::workflow::Workflows>,
    /// What its search boxes suggest, reused for a minute.
    pub(crate) suggested: suggest::Suggested,
}

pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) tables: Vec<Table>,
    pub(crate) options: DashboardOptions,
    pub(crate) csrf: String,
    /// The keys that tag the notices the dashboard writes (`?done=`).
    pub(crate) notice_key: notice::Key,
}

impl Shared {
    /// Where pages read: the replica when there is one.
    pub(crate) fn reads(&self) -> &PgPool {
        self.options.replica.as_ref().unwrap_or(&self.pool)
    }

    /// A table's counts as the overview and the queues page show them: the
    /// finished states from the history when no index counts them.
    async fn status(&self, t: &Table) -> std::result::Result<crate::admin::Status, Response> {
        t.admin
            .status_with_history(
                crate::store::StallOptions::default().stalled_max_age,
                &self.options.history_table,
            )
            .await
            .map_err(server_error)
    }

    fn table(&self, name: &str) -> std::result::Result<&Table, Response> {
        self.tables
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| (StatusCode::NOT_FOUND, "no such table").into_response())
    }
}

/// The dashboard: build it once, mount its [`router`](Dashboard::router).
pub struct Dashboard {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("tables", &self.shared.options.tables.len())
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// Checks every table (and its pause, limit and weight tables) now,
    /// and, unless [`read_only`](DashboardOptions::read_only), the grants
    /// its actions use.
    pub async fn new(pool: &PgPool, options: DashboardOptions) -> Result<Dashboard> {
        options.validate()?;
        let reads = match &options.replica {
            Some(replica) => {
                crate::check_connection(replica, crate::DEFAULT_CONNECT_TIMEOUT).await?;
                replica.clone()
            }
            None => pool.clone(),
        };
        cron::check(pool, options.cron_table.as_deref()).await?;
        let mut tables = Vec::new();
        for t in &options.tables {
            let workflows = workflow::open(&reads, t);
            let admin = Admin::new(&reads, t).await?;
            let writer = Admin::new(pool, t).await?;
            let pauses = match t.sql().pause_table {
                Some(_) => Some(Pauses::new(pool, t, PausesOptions::default()).await?),
                None => None,
            };
            let fairness = if t.is_fair() {
                Some(FairWeights::new(pool, t).await?)
            } else {
                None
            };
            if !options.read_only {
                grants::check_actions(&writer, pauses.as_ref(), fairness.as_ref()).await?;
            }
            let limits = match t.sql().limit_table {
                Some(_) => Some(Limits::new(pool, t).await?),
                None => None,
            };
            let error_history = t.sql().error_history.as_ref().map(|h| h.column.clone());
            // A read-only dashboard sends none (and may lack the grants).
            let signals = if t.has_signals() && !options.read_only {
                Some(crate::Signals::new(pool, t).await?)
            } else {
                None
            };
            tables.push(Table {
                name: t.name(),
                workflows,
                error_history,
                admin,
                writer,
                pauses,
                limits,
                fairness,
                signals,
                suggested: suggest::Suggested::default(),
            });
        }
        let shared = Arc::new(Shared {
            pool: pool.clone(),
            tables,
            options,
            csrf: auth::random_token(),
            notice_key: notice::key(),
        });
        Ok(Dashboard { shared })
    }

    /// The routes, to serve alone or to `nest` under a prefix; every link
    /// the pages draw is relative to where it is mounted.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(overview))
            .route("/assets/style.css", get(style))
            .route("/assets/live.js", get(live_script))
            .route("/t/{table}/jobs", get(jobs))
            .route("/t/{table}/jobs/{id}", get(job_page::job))
            .route("/t/{table}/jobs/{id}/action", post(actions::job_action))
            .route("/t/{table}/jobs/{id}/signal", post(signal::send))
            .route("/t/{table}/bulk", post(actions::bulk))
            .route("/t/{table}/workflows", get(workflows_list::list))
            .route("/t/{table}/workflows/{id}", get(workflow::workflow))
            .route("/t/{table}/queues", get(queues))
            .route("/t/{table}/cron", get(cron::cron))
            .route("/t/{table}/queues/pause", post(actions::pause))
            .route("/t/{table}/queues/limit", post(limits::set))
            .route("/t/{table}/fairness", get(fairness::page))
            .route("/t/{table}/fairness/weight", post(fairness::set))
            .route("/processes", get(processes::processes))
            .layer(middleware::from_fn_with_state(self.shared.clone(), guard))
            .with_state(self.shared.clone())
    }
}

/// Authenticates every request and sets the security headers.
async fn guard(State(s): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Some(mut user) = s.options.auth.user(&parts) else {
        if matches!(s.options.auth, Auth::None) {
            return (
                StatusCode::FORBIDDEN,
                "without sign-in the dashboard serves requests addressed to localhost only (set DashboardOptions::auth)",
            )
                .into_response();
        }
        let mut response =
            (StatusCode::UNAUTHORIZED, "sign in to see the dashboard").into_response();
        if let Some(challenge) = s.options.auth.challenge() {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        return response;
    };
    // Where the dashboard is mounted: the original path less the nested one.
    let base = match parts.extensions.get::<axum::extract::OriginalUri>() {
        Some(original) => {
            let (full, nested) = (original.0.path(), parts.uri.path());
            // The prefix itself arrives nested as "/".
            let base = if nested == "/" {
                full
            } else {
                full.strip_suffix(nested).unwrap_or("")
            };
            base.trim_end_matches('/').to_owned()
        }
        None => String::new(),
    };
    if s.options.read_only {
        user.role = Role::ReadOnly;
    }
    let replica = replica::lag(&s).await;
    parts.extensions.insert(Viewer {
        user,
        base,
        replica,
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The signed-in user and the mount prefix, for handlers.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub(crate) user: User,
    pub(crate) base: String,
    /// With a replica: how far behind it is (or why that is unknown).
    pub(crate) replica: replica::Lag,
}

impl Viewer {
    /// `path` under the mount prefix (the overview is the prefix itself: a
    /// nested router has no trailing-slash route).
    pub(crate) fn href(&self, path: &str) -> String {
        if path == "/" && !self.base.is_empty() {
            return self.base.clone();
        }
        format!("{}{path}", self.base)
    }

    fn admin(&self) -> std::result::Result<(), Response> {
        if self.user.role == Role::Admin {
            Ok(())
        } else {
            Err((StatusCode::FORBIDDEN, "read-only users cannot act").into_response())
        }
    }
}

/// An admin call's error. An option the admin refuses came from the request
/// (a filter, a page, a sort): 400 naming its parameter. Anything else: 500.
fn server_error(err: Error) -> Response {
    if let Error::InvalidOption { field, reason } = &err {
        let parameter = match *field {
            "fields" => "field",
            "workflow_id" => "workflow",
            other => other,
        };
        return bad_parameter(parameter, reason);
    }
    // The cause (SQL, relation names) goes to the log, not to the page.
    tracing::error!(error = %err, "dashboard query failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "the dashboard could not read or write the jobs; the cause is in the server's log",
    )
        .into_response()
}

/// 400: what is wrong with the query parameter, named first.
fn bad_parameter(parameter: &str, reason: &str) -> Response {
    (StatusCode::BAD_REQUEST, format!("{parameter}: {reason}")).into_response()
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
}

async fn live_script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("live.js"),
    )
}

async fn overview(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let range = match q.get("range").filter(|r| !r.is_empty()) {
        Some(r) => r.parse().map_err(server_error)?,
        None => crate::history::Range::default(),
    };
    let mut tables = Vec::new();
    for t in &s.tables {
        let status = s.status(t).await?;
        let paused = match &t.pauses {
            Some(p) => p.list().await.unwrap_or_default(),
            None => Vec::new(),
        };
        let charts = charts::read(s.reads(), &s.options.history_table, &t.name, range).await;
        tables.push(pages::TableOverview {
            name: &t.name,
            status,
            paused,
            charts,
        });
    }
    let nodes = match &s.options.node_table {
        Some(nt) => crate::cluster::nodes::live_nodes(s.reads(), nt, s.options.dead_after)
            .await
            .ok(),
        None => None,
    };
    Ok(
        pages::overview(&viewer, &s, &tables, nodes.as_deref(), range, &refresh(&q))
            .into_response(),
    )
}

async fn jobs(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path(table): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    if let Some(id) = q.get("id").map(|v| v.trim()).filter(|v| !v.is_empty()) {
        let not_id = |_| bad_parameter("id", &format!("{} is not a job id", excerpt(id)));
        let id: i64 = id.parse().map_err(not_id)?;
        let to = viewer.href(&format!("/t/{}/jobs/{id}", url_escape(&t.name)));
        return Ok(axum::response::Redirect::to(&to).into_response());
    }
    let hidden = HiddenColumns::of(t, &s.options.hidden_fields);
    let filter = filter_from(&q, &s.options.hidden_fields, hidden)
        .map_err(|message| (StatusCode::BAD_REQUEST, message).into_response())?;
    workflow::check_filter(t, &filter)?;
    let mut page = PageRequest::first(s.options.page_size);
    if let Some(after) = q.get("after").filter(|v| !v.is_empty()) {
        // Refused rather than ignored: a bad cursor must not restart the list.
        let not_id = |_| bad_parameter("after", &format!("{} is not a job id", excerpt(after)));
        page.after = Some(after.parse().map_err(not_id)?);
    }
    page.after_value = q.get("after_value").cloned();
    page.newest_first = newest_first(&q);
    if let Some(sort) = q.get("sort").filter(|v| !v.is_empty()) {
        page.sort = sort.parse().map_err(server_error)?;
    }
    let list = t.admin.list(&filter, page).await.map_err(server_error)?;
    let suggest = t.suggested.get(&t.admin).await.map_err(server_error)?;
    Ok(pages::jobs(&viewer, &s, t, &q, &list, &suggest, &refresh(&q)).into_response())
}

/// Replaces hidden fields' values, at any depth.
pub(crate) fn hide(value: &mut serde_json::Value, hidden: &[String]) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if hidden.contains(k) {
                    *v = serde_json::Value::String("[hidden]".into());
                } else {
                    hide(v, hidden);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| hide(v, hidden)),
        _ => {}
    }
}

async fn queues(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path(table): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let status = s.status(t).await?;
    let paused = match &t.pauses {
        Some(p) => p.list().await.map_err(server_error)?,
        None => Vec::new(),
    };
    let limits: Vec<(String, Limit)> = match &t.limits {
        Some(l) => l.list().await.map_err(server_error)?,
        None => Vec::new(),
    };
    let done = notice::of(&s, &q);
    Ok(pages::queues(
        &viewer,
        &s,
        t,
        &status,
        &paused,
        &limits,
        done,
        &refresh(&q),
    )
    .into_response())
}

/// Percent-encodes a URL component.
pub(crate) fn url_escape(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
