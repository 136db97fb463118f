//! The cron page (`/t/{table}/cron`): every schedule the table's schedulers
//! recorded in the cron table, with its expression and time zone, its last
//! and next tick (relative and absolute, in UTC and in the schedule's zone),
//! and the job it last enqueued, linked to the job's page. Read from the
//! cron table alone: the dashboard needs no scheduler of its own.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use sqlx::{PgPool, Row};

use super::pages::layout;
use super::{Shared, Table, Viewer, refresh, server_error, url_escape};
use crate::columns::Relation;
use crate::cron::schedule::{Schedule, time_zone};
use crate::error::{Error, Result};
use crate::job_filter::format_age;
use crate::sql;

/// A next tick older than this means no scheduler is running the schedule
/// (a running one enqueues within its interval, a second by default).
const OVERDUE_AFTER_SECS: i64 = 120;

/// Checks the cron table at start-up, when the dashboard shows one.
pub(super) async fn check(pool: &PgPool, cron_table: Option<&str>) -> Result<()> {
    let Some(name) = cron_table else {
        return Ok(());
    };
    let rel = Relation::parse("cron_table", name)?;
    crate::schema_check::require_columns(
        pool,
        &rel,
        "cron table",
        crate::cron::CRON_COLUMNS,
        crate::cron::CRON_TABLE_HINT,
    )
    .await
}

/// One schedule as the page shows it.
struct Entry {
    name: String,
    expression: Option<String>,
    zone: Option<String>,
    last_tick: DateTime<Utc>,
    last_job: Option<i64>,
    /// The tick after the last one, or why it cannot be known.
    next: std::result::Result<DateTime<Utc>, String>,
}

/// `GET /t/{table}/cron`.
pub(super) async fn cron(
    State(s): State<Arc<Shared>>,
    viewer: axum::Extension<Viewer>,
    Path(table): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> std::result::Result<Response, Response> {
    let t = s.table(&table)?;
    let Some(cron_table) = s.options.cron_table.as_deref() else {
        return Err((
            StatusCode::NOT_FOUND,
            "cron: the dashboard has no cron table (DashboardOptions::cron_table, `dbworker ui --cron-table`)",
        )
            .into_response());
    };
    let rel = Relation::parse("cron_table", cron_table).map_err(server_error)?;
    let rows = sql::cron_list(&rel, &t.name)
        .fetch_all(s.reads())
        .await
        .map_err(|e| server_error(Error::db("cron page")(e)))?;
    let now = rows.first().map_or_else(Utc::now, |r| micros(r.get("now")));
    let entries: Vec<Entry> = rows
        .iter()
        .map(|r| {
            let expression: Option<String> = r.get("expression");
            let zone: Option<String> = r.get("time_zone");
            let last_tick = micros(r.get("last_tick"));
            Entry {
                next: next_tick(expression.as_deref(), zone.as_deref(), last_tick),
                name: r.get("schedule"),
                expression,
                zone,
                last_tick,
                last_job: r.get("last_job_id"),
            }
        })
        .collect();
    Ok(page(&viewer, &s, t, &entries, now, &refresh(&q)).into_response())
}

/// The tick after `last`, as the scheduler will find it. A row written by a
/// build newer than this one may name a zone it does not know: said, and
/// the other rows are shown all the same.
fn next_tick(
    expression: Option<&str>,
    zone: Option<&str>,
    last: DateTime<Utc>,
) -> std::result::Result<DateTime<Utc>, String> {
    let expression =
        expression.ok_or("not yet recorded (no scheduler of this version has run it)")?;
    let schedule = Schedule::parse(expression).map_err(|e| e.to_string())?;
    let schedule = match zone {
        Some(z) => schedule.in_zone(z).map_err(|e| match e {
            Error::InvalidOption { reason, .. } => reason,
            other => other.to_string(),
        })?,
        None => schedule,
    };
    schedule
        .next_after(last)
        .ok_or_else(|| "none: the schedule never fires again".to_owned())
}

fn micros(value: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(value).unwrap_or_default()
}

/// `in 3h` or `5m ago`, from the database clock.
fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (at - now).num_milliseconds() as f64 / 1000.0;
    if secs >= 0.0 {
        format!("in {}", format_age(secs))
    } else {
        format!("{} ago", format_age(-secs))
    }
}

/// A tick: relative, then absolute in UTC and, for a zoned schedule, in its
/// zone, in a `<time>` element carrying the instant.
fn when(at: DateTime<Utc>, now: DateTime<Utc>, zone: Option<&str>) -> Markup {
    let local = zone
        .filter(|z| *z != "UTC")
        .and_then(|z| time_zone(z).ok())
        .map(|tz| {
            at.with_timezone(&tz)
                .format("%Y-%m-%d %H:%M:%S %Z")
                .to_string()
        });
    html! {
        time datetime=(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)) title=(at.to_rfc3339()) {
            (relative(at, now))
        }
        br;
        span class="muted" {
            (at.format("%Y-%m-%d %H:%M:%S UTC"))
            @if let Some(local) = local { " · " (local) }
        }
    }
}

fn page(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    entries: &[Entry],
    now: DateTime<Utc>,
    refresh: &super::Refresh,
) -> Markup {
    let job_href = |id: i64| viewer.href(&format!("/t/{}/jobs/{id}", url_escape(&t.name)));
    let body = html! {
        @if entries.is_empty() {
            p class="muted" { "No schedule has run on this table yet: a scheduler records each of its schedules at its first pass." }
        } @else {
            table id="cron" {
                tr { th { "schedule" } th { "expression" } th { "time zone" } th { "last tick" } th { "next tick" } th { "last job" } }
                @for e in entries {
                    tr {
                        td { (e.name) }
                        td { code { (e.expression.as_deref().unwrap_or("—")) } }
                        td { (e.zone.as_deref().unwrap_or("—")) }
                        td { (when(e.last_tick, now, e.zone.as_deref())) }
                        td {
                            @match &e.next {
                                Ok(next) => {
                                    (when(*next, now, e.zone.as_deref()))
                                    @if (now - *next).num_seconds() > OVERDUE_AFTER_SECS {
                                        br;
                                        strong class="overdue" { "overdue: is a scheduler running it?" }
                                    }
                                }
                                Err(why) => { span class="muted" { (why) } }
                            }
                        }
                        td {
                            @match e.last_job {
                                Some(id) => { a href=(job_href(id)) { (id) } }
                                None => { span class="muted" { "none yet" } }
                            }
                        }
                    }
                }
            }
            p class="muted" {
                "Times from the database clock. A tick skipped after downtime (the default backfill) moves the last tick without a job."
            }
        }
    };
    layout(
        viewer,
        s,
        &format!("Cron · {}", t.name),
        Some(refresh),
        body,
    )
}
