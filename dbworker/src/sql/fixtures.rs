//! The parameter structs the snapshots render statements with: each file's
//! `snapshots()` builds its statements from these, and `tests.rs` compares
//! what they render with `src/sql/snapshots/`. They are built here directly,
//! as the features' options resolve them, so the statement layer is tested on
//! its own floor.

use std::collections::HashMap;

use super::{ErrorHistory, JobRow, LogTables, StoreParams, Table};
use crate::columns::{Columns, Relation, quote};
use crate::retry::RetryPolicy;

pub(super) fn rel(text: &str) -> Relation {
    Relation::parse("table_name", text).unwrap()
}

/// The job history `app.jobs`'s purge waits for, catching up 6 h.
pub(super) fn recorded_by() -> super::purge::RecordedBy {
    super::purge::RecordedBy {
        history: rel("dbworker_history"),
        job_table: "app.jobs".into(),
        catch_up: std::time::Duration::from_secs(6 * 3600),
    }
}

/// The default columns, none renamed.
pub(super) fn plain() -> Columns {
    Columns::resolve(&HashMap::new()).unwrap()
}

/// The columns with `state` renamed to `status`.
pub(super) fn renamed() -> Columns {
    Columns::resolve(&HashMap::from([("state".to_owned(), "status".to_owned())])).unwrap()
}

/// `app.example_jobs` as the enqueuer writes it, with every optional column.
pub(super) fn enqueue_target() -> Table {
    let mut t = Table::new(rel("app.example_jobs"), renamed());
    t.key_column = Some("job_key".into());
    t.queue_column = Some("queue".into());
    t.priority_column = Some("priority".into());
    t.max_retries_column = Some("max_retries".into());
    t.flags_column = Some("flags".into());
    t
}

/// `example_jobs j` with `state` renamed, as `StoreOptions` resolves it.
pub(super) fn table(name: &str) -> StoreParams {
    let table = rel(name);
    StoreParams {
        column_expressions: vec![format!("{}.*", quote(&table.alias))],
        order_by: format!("{}.{}", quote(&table.alias), quote("id")),
        shared: std::sync::Arc::new(Table::new(table, renamed())),
        max_num_retries: 2,
        retry: RetryPolicy::default(),
        max_num_resets: 3,
        candidate_window: 50,
    }
}

/// The store's table, read directly or (`view`) through a view.
pub(super) fn resolved(view: bool) -> StoreParams {
    let mut t = table("example_jobs j");
    if view {
        let v = rel("example_jobs_with_repository_name v");
        t.column_expressions = vec![format!("{}.*", quote(&v.alias))];
        t.order_by = "v.repository_id, v.id DESC NULLS LAST".into();
        t.view = Some(v);
    }
    t
}

/// The store's table with an error history column.
pub(super) fn with_history() -> StoreParams {
    let mut h = resolved(false);
    h.error_history = Some(error_history());
    h
}

pub(super) fn error_history() -> ErrorHistory {
    ErrorHistory {
        column: "errors".into(),
        limit: 20,
    }
}

/// The store's table with a result column.
pub(super) fn with_results() -> StoreParams {
    let mut r = resolved(false);
    r.result_column = Some("result".into());
    r
}

/// The store's table with traces (`dbworker migration --traces`).
pub(super) fn with_traces() -> StoreParams {
    let mut r = resolved(false);
    r.traces = true;
    r
}

/// `store` on the HOT layout: the table has the generated `dbworker_live`.
pub(super) fn on_hot_layout(mut store: StoreParams) -> StoreParams {
    store.columns.live = true;
    store
}

/// `app.jobs j` with the default columns and a queue column.
fn queued_jobs() -> StoreParams {
    let mut o = table("app.jobs j");
    o.columns = plain();
    o.max_num_retries = 10;
    o.queue_column = Some("queue".into());
    o
}

/// `app.jobs j` with a pause table.
pub(super) fn paused() -> StoreParams {
    let mut o = queued_jobs();
    o.pause_table = Some(rel("dbworker_pauses"));
    o
}

/// `app.jobs j`, fair, paused by table, its priorities aging a level a minute
/// up to two levels.
pub(super) fn aging() -> StoreParams {
    let mut o = paused();
    o.priority_column = Some("priority".into());
    o.fair_weights = Some(rel("jobs_fair_weights"));
    o.order_by = r#""j"."priority" DESC, "j"."fair_tag", "j"."id""#.into();
    o.aging = Some(crate::sql::AgingParams {
        interval_secs: 60.0,
        max_boost: Some(2),
    });
    o
}

/// `app.jobs j` with a limit table.
pub(super) fn limited() -> StoreParams {
    let mut o = queued_jobs();
    o.limit_table = Some(rel("dbworker_limits"));
    o
}

/// The pause table, as the pause service names it.
pub(super) fn pauses() -> Relation {
    Relation::parse("pause_table", "dbworker_pauses").unwrap()
}

/// `app.example_jobs j` as the workflow statements read it.
pub(super) fn workflow_table() -> Table {
    Table::new(rel("app.example_jobs j"), renamed())
}

/// `app.example_jobs` as the admin reads it.
pub(super) fn admin_table() -> Table {
    let mut t = Table::new(rel("app.example_jobs"), renamed());
    t.queue_column = Some("queue".into());
    t.kind_column = Some("kind".into());
    t.key_column = Some("job_key".into());
    t.priority_column = Some("priority".into());
    t.max_retries_column = Some("max_retries".into());
    t
}

pub(super) fn nodes() -> Relation {
    rel("dbworker_nodes")
}

pub(super) fn log_tables() -> LogTables {
    let events = rel("app.events e");
    LogTables {
        column_expressions: vec![format!("{}.*", quote(&events.alias))],
        events,
        position_column: "position".into(),
        transaction_column: "transaction_id".into(),
        assignments: rel("dbworker_consumer_assignments"),
        checkpoints: rel("dbworker_consumer_checkpoints"),
        type_column: "aggregate_type".into(),
    }
}

/// A job of `values` and nothing else.
pub(super) fn row(values: &[(String, sea_query::Value)]) -> JobRow<'_> {
    JobRow {
        values,
        run_at: None,
        priority: None,
        queue: None,
        max_retries: None,
        kind: None,
        flags: None,
        payload: None,
        trace: None,
    }
}

/// `payload = text`, the values of a job.
pub(super) fn payload(text: &str) -> [(String, sea_query::Value); 1] {
    [("payload".to_owned(), sea_query::Value::from(text))]
}

/// A job of `values` in the queue `emails`, as a keyed enqueue writes it.
pub(super) fn keyed(values: &[(String, sea_query::Value)]) -> JobRow<'_> {
    JobRow {
        queue: Some("emails"),
        ..row(values)
    }
}

/// A job table named by SQL keywords (`app."select" "order"`), with quoted
/// control tables and columns: parsed unquoted, every statement quotes them.
pub(super) fn quoted() -> StoreParams {
    let mut o = table("app.\"select\" \"order\"");
    o.columns = Columns::resolve(&HashMap::from([(
        "state".to_owned(),
        "\"Status\"".to_owned(),
    )]))
    .unwrap();
    o.pause_table = Some(quoted_pauses());
    o.limit_table = Some(Relation::parse("limit_table", "\"limit\"").unwrap());
    o.queue_column = Some(crate::columns::column_name("queue_column", "\"group\"").unwrap());
    o.limit_key_column =
        Some(crate::columns::column_name("limit_key_column", "\"My Key\"").unwrap());
    o
}

/// The enqueuer's table `"order"`, with a key and a queue column.
pub(super) fn quoted_enqueue_target() -> Table {
    let mut e = Table::new(rel("\"order\""), plain());
    e.key_column = Some("key".into());
    e.queue_column = Some("group".into());
    e
}

/// The pause table `"pause"`.
pub(super) fn quoted_pauses() -> Relation {
    Relation::parse("pause_table", "\"pause\"").unwrap()
}
