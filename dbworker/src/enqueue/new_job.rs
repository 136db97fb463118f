//! `NewJob`: the values and scheduling options of one job to enqueue.

use crate::trace::TraceContext;
use std::time::{Duration, SystemTime};

use sea_query::Value;

use crate::sql_value::SqlValue;

use crate::sql::{JobRow, OnKey, RunAt};

/// What to do when a live job (queued, errored or processing) already holds
/// the new job's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyMode {
    /// A waiting job with the key takes the new job's columns and run-at, as
    /// if newly enqueued (failures reset, last error cleared). A processing
    /// one gives up the key and a new job is inserted.
    #[default]
    Replace,
    /// As `Replace`, but a waiting job with the key keeps its run-at.
    PreserveRunAt,
    /// Nothing changes if a live job holds the key, even a processing one.
    DedupeOnly,
    /// Nothing changes if any live or failed job holds the key: the new
    /// work may be dropped for good, hence "unsafe".
    UnsafeDedupe,
}

impl From<KeyMode> for OnKey {
    fn from(mode: KeyMode) -> OnKey {
        match mode {
            KeyMode::Replace => OnKey::Replace,
            KeyMode::PreserveRunAt => OnKey::PreserveRunAt,
            KeyMode::DedupeOnly => OnKey::DedupeOnly,
            KeyMode::UnsafeDedupe => OnKey::UnsafeDedupe,
        }
    }
}

/// What a dependent job does when a job it waits for ends without
/// completing (fails for good, or is canceled). A dependency on a job that
/// completes is always satisfied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DependencyPolicy {
    /// The dependent is canceled, and so, in turn, are the jobs waiting for it
    /// under this policy. Retrying the upstream job brings them back to
    /// `pending`.
    #[default]
    Cancel,
    /// A failed upstream job counts as done; a canceled one cancels.
    IgnoreFailed,
    /// A canceled upstream job counts as done; a failed one cancels.
    IgnoreCanceled,
    /// The dependency is satisfied however the upstream job ends.
    Ignore,
}

impl DependencyPolicy {
    /// The name stored in the edge table's `policy` column.
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyPolicy::Cancel => "cancel",
            DependencyPolicy::IgnoreFailed => "ignore_failed",
            DependencyPolicy::IgnoreCanceled => "ignore_canceled",
            DependencyPolicy::Ignore => "ignore",
        }
    }

    /// Whether an upstream job that ended in `state` (`failed` or
    /// `canceled`) still lets the dependent run.
    pub(crate) fn ignores(self, state: &str) -> bool {
        match self {
            DependencyPolicy::Cancel => false,
            DependencyPolicy::IgnoreFailed => state == "failed",
            DependencyPolicy::IgnoreCanceled => state == "canceled",
            DependencyPolicy::Ignore => true,
        }
    }
}

/// A job to enqueue: the application's column values plus scheduling options.
///
/// ```
/// use std::time::Duration;
/// let job = dbworker::NewJob::new()
///     .json("payload", serde_json::json!({"to": "a@example.com"}))
///     .set("attempt_limit", 3_i32)
///     .run_after(Duration::from_secs(60));
/// assert_eq!(job.columns().count(), 2);
/// ```
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    values: Vec<(String, Value)>,
    run_at: Option<RunAt>,
    priority: Option<i32>,
    queue: Option<String>,
    max_retries: Option<u32>,
    kind: Option<String>,
    flags: Option<Vec<String>>,
    /// Typed arguments (`NewJob::args`), for the enqueuer's payload column.
    payload: Option<Value>,
    key: Option<(String, KeyMode)>,
    after: Vec<(i64, DependencyPolicy)>,
    trace: Option<TraceContext>,
}

impl NewJob {
    /// A job with no column set: every column takes its default.
    pub fn new() -> Self {
        NewJob::default()
    }

    /// Sets one of the application's columns (bound, never formatted into SQL).
    pub fn set(mut self, column: impl Into<String>, value: impl Into<SqlValue>) -> Self {
        let column = column.into();
        self.values.retain(|(c, _)| *c != column);
        self.values.push((column, value.into().0));
        self
    }

    /// Sets a `json` or `jsonb` column.
    pub fn json(self, column: impl Into<String>, value: serde_json::Value) -> Self {
        self.set(column, value)
    }

    /// Runs no earlier than `at` (stored in `process_after`).
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(RunAt::At(at));
        self
    }

    /// Runs no earlier than `delay` after the enqueue, by the database clock.
    pub fn run_after(mut self, delay: Duration) -> Self {
        self.run_at = Some(RunAt::After(delay));
        self
    }

    /// Sets the priority column (needs `JobTableOptions::priority_column`).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets the queue column (needs `JobTableOptions::queue_column`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Sets the job's kind (needs `JobTableOptions::kind_column`): which handler
    /// of a [`KindRegistry`](workerutil::KindRegistry) runs it.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Sets the job's flags (needs `JobTableOptions::flags_column`): a store
    /// whose `ClaimOptions::forbidden_flags` holds any of them skips the job.
    ///
    /// ```
    /// let job = dbworker::NewJob::new().flags(["slow-api", "customer:7"]);
    /// # let _ = job;
    /// ```
    pub fn flags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.flags = Some(flags.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the job's fairness key on a fair table (`dbworker migration
    /// --fair`): the tenant, customer or account whose share of the claims
    /// it counts against, at most 512 characters (like a job key). Unset:
    /// the table's `key_from`, else the NULL key.
    pub fn fair_key(self, key: impl Into<String>) -> Self {
        self.set(crate::columns::FAIR_KEY, key.into())
    }

    /// Sets the job's declared cost on a fair table (default 1, at most
    /// 1,000,000; 0 or more than that is refused at enqueue): a key's share
    /// is counted in cost, so a job of cost 10 uses as much of it as ten of
    /// cost 1.
    pub fn fair_cost(self, cost: u32) -> Self {
        self.set(
            crate::columns::FAIR_COST,
            i32::try_from(cost).unwrap_or(i32::MAX),
        )
    }

    /// Overrides the store's `max_num_retries` for this job (needs
    /// `JobTableOptions::max_retries_column`, which every store on the table
    /// honours).
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// Gives the job a key: at most one live job holds a key at a time
    /// (needs `JobTableOptions::key_column`); `mode` says what happens when one
    /// already does. A processing job's columns are never changed.
    pub fn key(mut self, key: impl Into<String>, mode: KeyMode) -> Self {
        self.key = Some((key.into(), mode));
        self
    }

    /// Runs only after the jobs `ids` complete (needs
    /// `JobTableOptions::workflows`): the job waits as `pending`. An upstream
    /// job that already completed counts at once; one that already failed or
    /// was canceled applies [`DependencyPolicy::Cancel`] at once. Call again
    /// to add more.
    ///
    /// ```
    /// let job = dbworker::NewJob::new().after([17, 18]);
    /// ```
    pub fn after(self, ids: impl IntoIterator<Item = i64>) -> Self {
        self.after_with(ids, DependencyPolicy::Cancel)
    }

    /// Like [`after`](Self::after), with what to do when one of these jobs
    /// fails or is canceled.
    pub fn after_with(
        mut self,
        ids: impl IntoIterator<Item = i64>,
        policy: DependencyPolicy,
    ) -> Self {
        for id in ids {
            self.after.retain(|(u, _)| *u != id);
            self.after.push((id, policy));
        }
        self
    }

    /// Stores `context` as the job's trace context, on a table with
    /// `dbworker migration --traces`, instead of the current span's (which
    /// the enqueue stores by default with the `opentelemetry` feature):
    /// for a producer that carries a request's `traceparent` itself.
    pub fn trace_context(mut self, context: TraceContext) -> Self {
        self.trace = Some(context);
        self
    }

    /// The trace context the job names, if any.
    pub(crate) fn trace_value(&self) -> Option<&TraceContext> {
        self.trace.as_ref()
    }

    /// The jobs this one waits for, with their policies.
    pub(crate) fn after_value(&self) -> &[(i64, DependencyPolicy)] {
        &self.after
    }

    /// The application columns set so far.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|(c, _)| c.as_str())
    }

    /// The job as the enqueue statements take it.
    pub(crate) fn row(&self) -> JobRow<'_> {
        self.row_traced(None)
    }

    /// The job as the enqueue statements take it, with `ambient` (the
    /// enqueuer's current span) as its trace context unless it names one.
    pub(crate) fn row_traced<'a>(&'a self, ambient: Option<&'a TraceContext>) -> JobRow<'a> {
        JobRow {
            trace: self
                .trace
                .as_ref()
                .or(ambient)
                .map(|t| (t.traceparent(), t.tracestate())),
            values: &self.values,
            run_at: self.run_at,
            priority: self.priority,
            queue: self.queue.as_deref(),
            max_retries: self.max_retries,
            kind: self.kind.as_deref(),
            flags: self.flags.as_deref(),
            payload: self.payload.as_ref(),
        }
    }

    /// What of this job holds a NUL character (which Postgres's `text` and
    /// `jsonb` cannot store), named for the error: its queue, kind, key, a
    /// flag, or a column's value (with the JSON path where it is).
    pub(crate) fn nul_field(&self) -> Option<String> {
        for (name, value) in [("queue", &self.queue), ("kind", &self.kind)] {
            if let Some(value) = value.as_ref().filter(|v| v.contains('\0')) {
                return Some(format!("the job's {name} {value:?}"));
            }
        }
        if let Some((key, _)) = self.key.as_ref().filter(|(k, _)| k.contains('\0')) {
            return Some(format!("the job's key {key:?}"));
        }
        if let Some(flag) = self.flags.iter().flatten().find(|f| f.contains('\0')) {
            return Some(format!("the job's flag {flag:?}"));
        }
        if let Some(at) = self.payload.as_ref().and_then(nul_in) {
            return Some(format!("the job's arguments{at}"));
        }
        self.values.iter().find_map(|(column, value)| {
            Some(format!("the job's column `{column}`{}", nul_in(value)?))
        })
    }

    pub(crate) fn values(&self) -> &[(String, Value)] {
        &self.values
    }

    pub(crate) fn run_at_value(&self) -> Option<RunAt> {
        self.run_at
    }

    pub(crate) fn priority_value(&self) -> Option<i32> {
        self.priority
    }

    pub(crate) fn queue_value(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    pub(crate) fn kind_value(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    pub(crate) fn flags_value(&self) -> Option<&[String]> {
        self.flags.as_deref()
    }

    pub(crate) fn max_retries_value(&self) -> Option<u32> {
        self.max_retries
    }

    pub(crate) fn payload_value(&self) -> Option<&Value> {
        self.payload.as_ref()
    }

    /// Sets the typed arguments' JSON (see `enqueue/args.rs`).
    pub(super) fn with_payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = Some(Value::Json(Some(Box::new(payload))));
        self
    }

    pub(crate) fn key_value(&self) -> Option<(&str, KeyMode)> {
        self.key.as_ref().map(|(k, m)| (k.as_str(), *m))
    }
}

/// Where a bound value holds a NUL character: `""` for the whole value, ` (at
/// $.path)` inside JSON, ` (at [i])` in an array; `None` without one.
fn nul_in(value: &Value) -> Option<String> {
    match value {
        Value::String(Some(s)) => s.contains('\0').then(String::new),
        Value::Char(Some(c)) => (*c == '\0').then(String::new),
        Value::Json(Some(json)) => {
            crate::message::nul_path(json).map(|path| format!(" (at {path})"))
        }
        Value::Array(_, Some(items)) => items
            .iter()
            .position(|item| nul_in(item).is_some())
            .map(|i| format!(" (at [{i}])")),
        _ => None,
    }
}
