//! The job list's filter and order from query parameters (also the bulk
//! form's `f_` fields), and the spans of seconds forms take: each bad input
//! refused naming its parameter, before any query.

use std::collections::HashMap;
use std::time::Duration;

use workerutil::JobState;

use super::Table;
use crate::error::Error;
use crate::job_filter::{FieldFilter, JobFilter, excerpt};

/// The job list's columns that `DashboardOptions::hidden_fields` names (it
/// names columns as well as JSON fields): never shown in the list, nor
/// filtered or suggested on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HiddenColumns {
    pub(crate) queue: bool,
    pub(crate) kind: bool,
    pub(crate) host: bool,
    pub(crate) failure: bool,
}

impl HiddenColumns {
    pub(crate) fn of(t: &Table, hidden: &[String]) -> HiddenColumns {
        let a = t.admin.table();
        let is = |column: Option<&str>| {
            column.is_some_and(|c| {
                let name = c.rsplit('.').next().unwrap_or(c);
                hidden.iter().any(|h| h == c || h == name)
            })
        };
        HiddenColumns {
            queue: is(a.queue_column.as_deref()),
            kind: is(a.kind_column.as_deref()),
            host: is(Some(&a.columns.worker_hostname)),
            failure: is(Some(&a.columns.failure_message)),
        }
    }
}

/// The longest span a form or filter takes, 100 years: the database cannot
/// subtract (or add) much more from its clock, and no job waits longer.
const MAX_SECONDS: f64 = 100.0 * 365.25 * 86_400.0;

/// A span of seconds from `parameter`: a finite number from 0 to 100 years;
/// the error names the parameter and quotes the input cut short.
pub(crate) fn seconds(parameter: &str, text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| (0.0..=MAX_SECONDS).contains(s))
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            format!(
                "{parameter}: {} is not seconds from 0 to {MAX_SECONDS} (100 years)",
                excerpt(text)
            )
        })
}

/// Whether a job list shows newest first: as `order` asks, else when it
/// searches the failure text or a field, so a search's first page holds the
/// recent matches rather than the oldest.
pub(crate) fn newest_first(q: &HashMap<String, String>) -> bool {
    let given = |k: &str| q.get(k).is_some_and(|v| !v.trim().is_empty());
    match q.get("order").map(String::as_str) {
        Some("newest") => true,
        Some("oldest") => false,
        _ => given("failure") || given("field"),
    }
}

/// The list filter from query parameters; refuses hidden fields and columns. Each error
/// names its parameter and quotes the input cut short.
pub(crate) fn filter_from(
    q: &HashMap<String, String>,
    hidden: &[String],
    columns: HiddenColumns,
) -> Result<JobFilter, String> {
    let mut f = JobFilter::default();
    let given = |k: &str| q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    for (parameter, is_hidden) in [
        ("queue", columns.queue),
        ("kind", columns.kind),
        ("failure", columns.failure),
    ] {
        if is_hidden && given(parameter).is_some() {
            return Err(format!("{parameter}: that column is hidden"));
        }
    }
    if let Some(state) = given("state") {
        f.states = vec![
            state
                .parse::<JobState>()
                .map_err(|_| format!("state: unknown state {}", excerpt(state)))?,
        ];
    }
    f.queue = given("queue").map(str::to_owned);
    f.kind = given("kind").map(str::to_owned);
    if let Some(older) = given("older_than_secs") {
        f.older_than = Some(seconds("older_than_secs", older)?);
    }
    f.failure_contains = given("failure").map(str::to_owned);
    if let Some(id) = given("workflow") {
        let not_id = |_| format!("workflow: {} is not a workflow id", excerpt(id));
        f.workflow_id = Some(id.parse().map_err(not_id)?);
    }
    if let Some(field) = given("field") {
        let field: FieldFilter = field.parse().map_err(|e| match e {
            Error::InvalidOption { reason, .. } => format!("field: {reason}"),
            other => format!("field: {other}"),
        })?;
        // A value holding a hidden key (the whole column as Postgres prints
        // it, or a parent object of the key) matches only when the secret
        // in it is right: refused like the hidden key itself.
        if hidden
            .iter()
            .any(|h| *h == field.column || field.path.contains(h))
            || holds_hidden(&field.value, hidden)
        {
            return Err("field: that field is hidden".into());
        }
        f.fields.push(field);
    }
    Ok(f)
}

/// Whether `value`, read as JSON, is an object or array with a hidden key at
/// any depth. A value that is not JSON cannot equal a JSON object's or
/// array's text, so it matches no parent of a hidden key.
fn holds_hidden(value: &str, hidden: &[String]) -> bool {
    fn holds(v: &serde_json::Value, hidden: &[String]) -> bool {
        match v {
            serde_json::Value::Object(map) => map
                .iter()
                .any(|(k, v)| hidden.contains(k) || holds(v, hidden)),
            serde_json::Value::Array(items) => items.iter().any(|v| holds(v, hidden)),
            _ => false,
        }
    }
    serde_json::from_str(value).is_ok_and(|v| holds(&v, hidden))
}
