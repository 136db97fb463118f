//! `--format json`: one JSON document per command, its shape stable and
//! documented in docs/operations.md ("JSON output"). Durations are seconds
//! (numbers), instants RFC 3339 strings, missing values `null`.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use dbworker::admin::{FinishedCounts, JobPage, QueueCounts, Status};
use dbworker::control::Pause;
use dbworker::workflow::WorkflowStatus;
use serde_json::{Value, json};

/// Prints `value` on one line, safe on a terminal ([`super::text::json`]).
pub(crate) fn print_json(value: &Value) -> Result<()> {
    let text = serde_json::to_string(value).context("the output as JSON")?;
    println!("{}", super::text::json(&text));
    Ok(())
}

/// One queue's counts (or the total's).
fn counts(q: &QueueCounts) -> Value {
    json!({
        "queue": q.queue,
        "pending": q.pending,
        "scheduled": q.scheduled,
        "available": q.available,
        "queued": q.queued,
        "errored": q.errored,
        "processing": q.processing,
        "stalled": q.stalled,
        "completed": q.completed,
        "failed": q.failed,
        "canceled": q.canceled,
        "failed_last_hour": q.failed_last_hour,
    })
}

/// `dbworker status --format json`.
pub(crate) fn status(table: &str, s: &Status, paused: Option<&[Pause]>) -> Value {
    let (finished, period) = match s.finished {
        FinishedCounts::Exact => ("exact", None),
        FinishedCounts::FromHistory { covered } => ("history", Some(covered.as_secs_f64())),
        _ => ("estimated", None),
    };
    let hosts: Vec<Value> = s
        .processing_by_host
        .iter()
        .map(|(host, n)| json!({ "host": host, "processing": n }))
        .collect();
    let paused = paused.map(|p| {
        p.iter()
            .map(|p| json!({ "queue": p.queue, "paused_by": p.paused_by, "seconds": p.seconds }))
            .collect::<Vec<_>>()
    });
    json!({
        "table": table,
        "queues": s.queues.iter().map(counts).collect::<Vec<_>>(),
        "total": counts(&s.total),
        "finished_counts": finished,
        "finished_period_seconds": period,
        "stalled_after_seconds": s.stalled_age.as_secs_f64(),
        "oldest_waiting_seconds": s.oldest_waiting_seconds,
        "processing_by_host": hosts,
        "estimated_rows": s.estimated_rows,
        "paused": paused,
    })
}

/// `dbworker list --format json`.
pub(crate) fn page(page: &JobPage) -> Value {
    let jobs: Vec<Value> = page
        .jobs
        .iter()
        .map(|j| {
            json!({
                "id": j.id,
                "state": j.state.as_str(),
                "queue": j.queue,
                "kind": j.kind,
                "failures": j.num_failures,
                "age_seconds": j.age_seconds,
                "host": j.worker_hostname,
                "failure_message": j.failure_message,
                "workflow_id": j.workflow_id,
            })
        })
        .collect();
    json!({
        "jobs": jobs,
        "next": page.next.map(|after| json!({ "after": after, "after_value": page.next_value })),
        "searched": page.searched.map(|rows| json!({ "rows": rows, "down_to": page.next })),
    })
}

fn instant(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| {
        Value::String(chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339())
    })
}

/// `dbworker workflow show --format json`; `edges` as `[upstream, dependent]`.
pub(crate) fn workflow(w: &WorkflowStatus, edges: &[(i64, i64)]) -> Value {
    let tasks: Vec<Value> = w
        .tasks
        .iter()
        .map(|t| {
            let ran = match (t.started_at, t.finished_at) {
                (Some(s), Some(f)) => f.duration_since(s).ok(),
                _ => None,
            };
            json!({
                "id": t.id,
                "name": t.name,
                "state": t.state,
                "started_at": instant(t.started_at),
                "finished_at": instant(t.finished_at),
                "ran_seconds": ran.map(|d: Duration| d.as_secs_f64()),
                "waits_on": t.waits_on,
                "blocked_by": t.blocked_by,
            })
        })
        .collect();
    json!({ "id": w.id, "counts": w.counts, "tasks": tasks, "edges": edges })
}
