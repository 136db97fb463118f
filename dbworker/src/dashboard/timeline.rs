//! A job's timeline, as the job page shows it: queued, each failed attempt
//! (from the error history: its worker, how long it ran, its error), the
//! last attempt, and how the job ended; every time by the database clock.

use maud::{Markup, html};
use serde_json::Value;

use crate::job_filter::format_age;

/// An RFC 3339 timestamp, parsed.
fn parsed(value: &Value) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(value.as_str()?).ok()
}

/// Seconds since the epoch of `at`.
fn epoch(at: &chrono::DateTime<chrono::FixedOffset>) -> f64 {
    #[allow(clippy::cast_precision_loss)] // microseconds since 1970 fit an f64 well enough
    let micros = at.timestamp_micros() as f64;
    micros / 1e6
}

/// Seconds since the epoch of an RFC 3339 timestamp.
fn secs(value: &Value) -> Option<f64> {
    parsed(value).as_ref().map(epoch)
}

/// A timestamp as `3m ago (2026-11-26 19:06:24 UTC)`, or `in 5m (…)` for one
/// ahead, against the database clock's `now` (seconds since the epoch).
pub(crate) fn when(value: &Value, now: f64) -> Markup {
    let Some(text) = value.as_str() else {
        return html! { span class="muted" { "–" } };
    };
    let Some(at) = parsed(value) else {
        return html! { (text) };
    };
    let ago = now - epoch(&at);
    let relative = if ago >= 0.0 {
        format!("{} ago", format_age(ago))
    } else {
        format!("in {}", format_age(-ago))
    };
    let absolute = at
        .with_timezone(&chrono::Utc)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();
    html! { span class="when" title=(text) { (relative) } " " span class="muted" { "(" (absolute) ")" } }
}

/// How long from `from` to `to`, when both are times and in order.
fn ran(from: &Value, to: &Value) -> Option<String> {
    let (a, b) = (secs(from)?, secs(to)?);
    (b >= a).then(|| format_age(b - a))
}

/// What the timeline is drawn from: the row's times and its error history.
pub(super) struct Facts<'a> {
    pub(super) state: &'a str,
    pub(super) queued_at: Value,
    pub(super) started_at: Value,
    pub(super) finished_at: Value,
    pub(super) worker: &'a str,
    pub(super) failure: Option<&'a str>,
    /// The error history's entries, oldest first.
    pub(super) attempts: &'a [Value],
}

/// The timeline as a table: when, and what happened.
pub(super) fn timeline(f: &Facts<'_>, now: f64) -> Markup {
    let last_failed_at = f.attempts.last().map(|e| e["at"].clone());
    // The last attempt is not in the history unless it failed: it started
    // after the last failure recorded there.
    let last_started = !f.started_at.is_null()
        && last_failed_at
            .as_ref()
            .is_none_or(|at| secs(&f.started_at) > secs(at));
    let next_attempt = f
        .attempts
        .last()
        .and_then(|e| e["attempt"].as_i64())
        .map_or(1, |n| n + 1);
    let finished = matches!(f.state, "completed" | "failed" | "canceled");
    html! {
        table class="timeline" id="timeline" {
            tr { th { "When" } th { "What" } }
            tr { td { (when(&f.queued_at, now)) } td { "queued" } }
            @for e in f.attempts {
                tr class="attempt-failed" {
                    td { (when(&e["at"], now)) }
                    td {
                        "attempt " (e["attempt"]) " failed"
                        @if let Some(w) = e["worker"].as_str().filter(|w| !w.is_empty()) { " on " (w) }
                        @if let Some(d) = ran(&e["started"], &e["at"]) { " after " (d) }
                        @if let Some(m) = e["message"].as_str() { ": " span class="failure" { (m) } }
                    }
                }
            }
            @if last_started {
                tr class="attempt" {
                    td { (when(&f.started_at, now)) }
                    td {
                        "attempt " (next_attempt) " started"
                        @if !f.worker.is_empty() { " on " (f.worker) }
                        @if f.state == "processing" {
                            @if let Some(s) = secs(&f.started_at).filter(|s| now >= *s) { " · running for " (format_age(now - s)) }
                        }
                    }
                }
            }
            @if finished {
                tr class="finished" {
                    td { (when(&f.finished_at, now)) }
                    td {
                        (f.state)
                        @if last_started { @if let Some(d) = ran(&f.started_at, &f.finished_at) { " after running " (d) } }
                        @if f.state != "completed" { @if let Some(m) = f.failure { ": " span class="failure" { (m) } } }
                    }
                }
            } @else if !last_started {
                tr { td { span class="muted" { "now" } } td { (f.state) ", waiting" } }
            }
        }
    }
}
