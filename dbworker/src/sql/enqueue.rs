//! The enqueue side: rows inserted one or many per statement, keyed inserts, COPY.

use crate::columns::{AWAITING, CHECKPOINT, PROGRESS, TRACEPARENT, TRACESTATE};
use std::time::{Duration, SystemTime};

use super::claim::cte;
use super::{Statement, Table, alias, col, counter, plain_table, state};
use crate::columns::{Relation, quote};
use sea_query::{
    Alias, Asterisk, DeleteStatement, Expr, ExprTrait, InsertStatement, OnConflict,
    PostgresQueryBuilder, Query, SelectStatement, TableRef, WithClause,
};
use sea_query_sqlx::SqlxBinder;
use workerutil::JobState;

/// When a new job becomes eligible. Both are computed by the database clock
/// or stored as given; the worker compares them with the database clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RunAt {
    /// At this instant.
    At(SystemTime),
    /// This long after the enqueue, by the database clock.
    After(Duration),
}

/// A new job's values as the statements take them (from `NewJob::row`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobRow<'a> {
    pub(crate) values: &'a [(String, sea_query::Value)],
    pub(crate) run_at: Option<RunAt>,
    pub(crate) priority: Option<i32>,
    pub(crate) queue: Option<&'a str>,
    pub(crate) max_retries: Option<u32>,
    pub(crate) kind: Option<&'a str>,
    pub(crate) flags: Option<&'a [String]>,
    /// Typed arguments, for the payload column (a JSON value).
    pub(crate) payload: Option<&'a sea_query::Value>,
    /// The trace context (`traceparent`, `tracestate`), for a table with
    /// traces.
    pub(crate) trace: Option<(&'a str, Option<&'a str>)>,
}

/// What a keyed insert does when a live job holds the key (the enqueue side's
/// `KeyMode`, as the statement sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnKey {
    /// A waiting holder takes the new values and run-at.
    Replace,
    /// A waiting holder takes the new values, keeping its run-at.
    PreserveRunAt,
    /// Nothing changes.
    DedupeOnly,
    /// Nothing changes, and nothing is inserted while a failed job holds the key either.
    UnsafeDedupe,
}

impl OnKey {
    /// Whether a waiting holder takes the new values (and a processing one
    /// gives the key up to a new job).
    pub(crate) fn replaces(self) -> bool {
        matches!(self, OnKey::Replace | OnKey::PreserveRunAt)
    }
}

/// The job table as an insert target, aliased so `ON CONFLICT … DO UPDATE`
/// can name the existing row.
pub(super) const ENQUEUE_ALIAS: &str = "dbworker_job";

pub(super) fn enqueue_target(t: &Table) -> TableRef {
    let r: TableRef = match &t.table.schema {
        Some(schema) => (alias(schema), alias(&t.table.name)).into(),
        None => alias(&t.table.name).into(),
    };
    r.alias(alias(ENQUEUE_ALIAS))
}

/// `process_after` for a run-at: an instant as given, or a delay from the
/// database clock's `now()`.
pub(super) fn run_at_expr(run_at: RunAt) -> Expr {
    match run_at {
        RunAt::At(at) => {
            let secs = match at.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => d.as_secs_f64(),
                Err(before) => -before.duration().as_secs_f64(),
            };
            Expr::cust_with_values("to_timestamp($1::float8)", [secs])
        }
        RunAt::After(delay) => Expr::cust_with_values(
            "now() + make_interval(secs => $1::float8)",
            [delay.as_secs_f64()],
        ),
    }
}

/// The columns and values of a new row: the application's columns, then
/// `process_after`, priority, queue and key where configured and set.
pub(super) fn enqueue_columns(
    t: &Table,
    job: &JobRow<'_>,
    key: Option<&str>,
) -> Vec<(String, Expr)> {
    let mut row: Vec<(String, Expr)> = job
        .values
        .iter()
        .map(|(c, v)| (c.clone(), Expr::val(v.clone())))
        .collect();
    if let Some(run_at) = job.run_at {
        row.push((t.columns.process_after.clone(), run_at_expr(run_at)));
    }
    if let (Some(column), Some(p)) = (&t.priority_column, job.priority) {
        row.push((column.clone(), Expr::val(p)));
    }
    if let (Some(column), Some(q)) = (&t.queue_column, job.queue) {
        row.push((column.clone(), Expr::val(q)));
    }
    if let (Some(column), Some(m)) = (&t.max_retries_column, job.max_retries) {
        row.push((column.clone(), Expr::val(i64::from(m))));
    }
    if let (Some(column), Some(k)) = (&t.kind_column, job.kind) {
        row.push((column.clone(), Expr::val(k)));
    }
    if let (Some(column), Some(f)) = (&t.flags_column, job.flags) {
        row.push((column.clone(), flags_value(f)));
    }
    if let (Some(column), Some(p)) = (&t.payload_column, job.payload) {
        row.push((column.clone(), Expr::val(p.clone())));
    }
    if let (Some(column), Some(k)) = (&t.key_column, key) {
        row.push((column.clone(), Expr::val(k)));
    }
    if let (true, Some((parent, state))) = (t.traces, job.trace) {
        row.push((TRACEPARENT.to_owned(), Expr::val(parent)));
        // Set beside it even when absent: a session setting's state belongs
        // to another context.
        row.push((TRACESTATE.to_owned(), Expr::val(state.map(str::to_owned))));
    }
    row
}

/// Flags as one bound `text[]` (the cast keeps an empty list typed).
pub(crate) fn flags_value(flags: &[String]) -> Expr {
    Expr::cust_with_values("$1::text[]", [sea_query::Value::from(flags.to_vec())])
}

/// `RETURNING id::bigint AS id, (xmax = 0) AS inserted`: an updated row has the
/// updating transaction in `xmax`, a new one has none.
pub(super) fn enqueue_returning(t: &Table, q: &mut InsertStatement) {
    q.returning(Query::returning().exprs([
        Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(ENQUEUE_ALIAS),
            quote(&t.columns.id)
        )),
        Expr::cust(format!(
            "({}.xmax = 0) AS \"inserted\"",
            quote(ENQUEUE_ALIAS)
        )),
    ]));
}

/// Inserts unkeyed jobs in one statement: the union of their columns, with
/// `DEFAULT` where a job sets none. Returns `(id, inserted)` in input order.
pub(crate) fn enqueue_rows(t: &Table, jobs: &[JobRow<'_>]) -> Statement {
    let rows: Vec<Vec<(String, Expr)>> = jobs.iter().map(|j| enqueue_columns(t, j, None)).collect();
    let mut names: Vec<String> = vec![t.columns.process_after.clone()];
    for (c, _) in rows.iter().flatten() {
        if !names.contains(c) {
            names.push(c.clone());
        }
    }
    let mut q = Query::insert();
    q.into_table(enqueue_target(t))
        .columns(names.iter().map(|n| alias(n)));
    for mut row in rows {
        let values: Vec<Expr> = names
            .iter()
            .map(|n| match row.iter().position(|(c, _)| c == n) {
                Some(i) => row.swap_remove(i).1,
                None => Expr::cust("DEFAULT"),
            })
            .collect();
        q.values_panic(values);
    }
    // An unkeyed insert always inserts: no `inserted` column (and no `xmax`,
    // which a partitioned table cannot return).
    q.returning(Query::returning().expr(Expr::cust(format!(
        "{}.{}::bigint AS \"id\"",
        quote(ENQUEUE_ALIAS),
        quote(&t.columns.id)
    ))));
    Statement::from(&q)
}

/// The columns a waiting key holder takes from a new job with the same key:
/// the application's values, the run-at (`Replace`) and the optional columns set.
pub(super) fn replaced_columns(t: &Table, job: &JobRow<'_>, mode: OnKey) -> Vec<String> {
    let mut updated: Vec<String> = job.values.iter().map(|(c, _)| c.clone()).collect();
    if mode == OnKey::Replace {
        updated.push(t.columns.process_after.clone());
    }
    for (set, column) in [
        (job.priority.is_some(), &t.priority_column),
        (job.queue.is_some(), &t.queue_column),
        (job.max_retries.is_some(), &t.max_retries_column),
        (job.kind.is_some(), &t.kind_column),
        (job.flags.is_some(), &t.flags_column),
        (job.payload.is_some(), &t.payload_column),
    ] {
        if set {
            updated.extend(column.clone());
        }
    }
    updated
}

/// What a replaced holder's state columns become: as if newly enqueued (an
/// errored holder starts over: no failures, resets, cancel request or
/// checkpoint of the old work). Under `PreserveRunAt` a holder that has
/// failed before takes the new run time `new_run_at` all the same (as
/// graphile-worker does): its old one was a retry's, not the schedule the
/// mode preserves.
pub(super) fn as_new(t: &Table, mode: OnKey, new_run_at: Expr) -> Vec<(Alias, Expr)> {
    let c = &t.columns;
    let mut values = vec![
        (alias(&c.state), state(JobState::Queued)),
        (alias(&c.num_failures), Expr::val(0)),
        (alias(&c.num_resets), Expr::val(0)),
        (alias(&c.failure_message), Expr::cust("NULL")),
        (alias(&c.finished_at), Expr::cust("NULL")),
        // A cancel requested of the old work (and left by a reset) would
        // cancel the new work at its claim.
        (alias(&c.cancel), Expr::cust("false")),
    ];
    if t.progress {
        // `progress_seq` stays: it only ever grows, fencing stale writes.
        values.push((alias(PROGRESS), Expr::cust("NULL")));
        values.push((alias(CHECKPOINT), Expr::cust("NULL")));
    }
    if t.signals.is_some() {
        // The new work waits for nothing: a signal to the old wait's name
        // must not wake it before its run time. (Signals sent to the key
        // stay in the mailbox: they are the live holder's.)
        values.push((alias(AWAITING), Expr::cust("NULL")));
    }
    if mode == OnKey::PreserveRunAt {
        // SET reads the row as it was: these are the holder's old failures,
        // and its wait, whose timeout is no schedule either.
        let mut failed_before = counter(ENQUEUE_ALIAS, &c.num_failures).gt(0);
        if t.signals.is_some() {
            failed_before = failed_before.or(col(ENQUEUE_ALIAS, AWAITING).is_not_null());
        }
        values.push((
            alias(&c.process_after),
            Expr::case(failed_before, new_run_at)
                .finally(col(ENQUEUE_ALIAS, &c.process_after))
                .into(),
        ));
    }
    values
}

/// `NOT EXISTS` a failed job with `key`: `UnsafeDedupe` inserts nothing then.
pub(super) fn no_failed_holder(t: &Table, key: &str) -> Expr {
    const FAILED: &str = "dbworker_failed";
    let key_column = t.key_column.clone().unwrap_or_default();
    let failed = Query::select()
        .expr(Expr::cust("1"))
        .from(plain_table(&t.table).alias(alias(FAILED)))
        .and_where(col(FAILED, &key_column).eq(key))
        .and_where(col(FAILED, &t.columns.state).eq(state(JobState::Failed)))
        .to_owned();
    Expr::exists(failed).not()
}

/// The states in which a job holds its key (the unique index's predicate).
pub(super) fn key_live_states(state_column: &str) -> String {
    key_states(state_column, false)
}

/// The live states, and `failed` too where `UnsafeDedupe` counts it.
fn key_states(state_column: &str, with_failed: bool) -> String {
    let failed = if with_failed { ", 'failed'" } else { "" };
    format!(
        "{} IN ('queued', 'errored', 'processing'{failed})",
        quote(state_column)
    )
}

/// Inserts a keyed job, unless a live job holds the key: then a waiting one
/// takes the new values as if newly enqueued (`Replace`, `PreserveRunAt`:
/// failures reset, last error cleared, `queued`), and a processing one or any
/// with `DedupeOnly` is left alone (no row returned). `UnsafeDedupe` also
/// inserts nothing while a failed job holds the key.
pub(crate) fn enqueue_keyed(t: &Table, job: &JobRow<'_>, key: &str, mode: OnKey) -> Statement {
    let row = enqueue_columns(t, job, Some(key));
    let key_column = t.key_column.clone().unwrap_or_default();
    let mut q = Query::insert();
    q.into_table(enqueue_target(t))
        .columns(row.iter().map(|(c, _)| alias(c)));
    if mode == OnKey::UnsafeDedupe {
        // INSERT … SELECT, so the row is only proposed while no failed job
        // holds the key (the unique index covers the live states only).
        let select = Query::select()
            .exprs(row.iter().map(|(_, e)| e.clone()))
            .and_where(no_failed_holder(t, key))
            .to_owned();
        q.select_from(select)
            .expect("the select has one expression per column");
    } else {
        q.values_panic(row.iter().map(|(_, e)| e.clone()));
    }
    let mut conflict = OnConflict::column(alias(&key_column));
    conflict.target_and_where(Expr::cust(key_live_states(&t.columns.state)));
    let updated = replaced_columns(t, job, mode);
    if mode.replaces() {
        let c = &t.columns;
        // As if newly enqueued: an errored holder starts over.
        conflict
            .update_columns(updated.iter().map(|c| alias(c)))
            .values(as_new(
                t,
                mode,
                Expr::cust(format!("\"excluded\".{}", quote(&c.process_after))),
            ))
            .action_and_where(Expr::cust(format!(
                "{}.{} IN ('queued', 'errored')",
                quote(ENQUEUE_ALIAS),
                quote(&c.state)
            )));
    } else {
        conflict.do_nothing();
    }
    q.on_conflict(conflict);
    enqueue_returning(t, &mut q);
    match &t.progress_table {
        Some(side) if mode.replaces() => {
            const KEYED: &str = "dbworker_keyed";
            let mut with = WithClause::new();
            with.cte(cte(q, KEYED, false));
            let replaced = Query::select()
                .column(alias("id"))
                .from(alias(KEYED))
                .and_where(Expr::cust("NOT \"inserted\""))
                .to_owned();
            with.cte(cte(
                old_work_dropped(side, replaced),
                "dbworker_dropped",
                false,
            ));
            let result = Query::select()
                .column((alias(KEYED), Asterisk))
                .from(alias(KEYED))
                .to_owned();
            Statement::from(&result.with(with))
        }
        _ => Statement::from(&q),
    }
}

/// On a table whose progress lives in the side table, a replaced holder's
/// side row (the old work's progress and checkpoint), deleted in the
/// replacing statement: the new work must not resume at the old one's
/// checkpoint, and no worker may claim it in between.
pub(super) fn old_work_dropped(side: &Relation, replaced_ids: SelectStatement) -> DeleteStatement {
    Query::delete()
        .from_table(plain_table(side))
        .and_where(Expr::col(alias("job_id")).in_subquery(replaced_ids))
        .to_owned()
}

/// A processing job gives up `key`, so a replacing enqueue can insert a new
/// job: its key set NULL and, with a retry-limit column, its retries ended
/// (the new job carries the work now). Only the key and the limit change:
/// the running attempt's state, token and marks are untouched.
pub(crate) fn release_key(t: &Table, key: &str) -> Statement {
    let key_column = t.key_column.clone().unwrap_or_default();
    let c = &t.columns;
    let mut q = Query::update();
    q.table(enqueue_target(t))
        .value(alias(&key_column), Expr::cust("NULL"));
    if let Some(limit) = &t.max_retries_column {
        q.value(alias(limit), counter(ENQUEUE_ALIAS, &c.num_failures));
    }
    q.and_where(col(ENQUEUE_ALIAS, &key_column).eq(key))
        .and_where(col(ENQUEUE_ALIAS, &c.state).eq(state(JobState::Processing)))
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(ENQUEUE_ALIAS),
            quote(&c.id)
        ))));
    Statement::from(&q)
}

/// `COPY <table> (<columns>) FROM STDIN` in text format, for bulk loads.
pub(crate) fn copy_in(t: &Table, columns: &[String]) -> String {
    let table = t.table.quoted();
    let columns: Vec<String> = columns.iter().map(|c| quote(c)).collect();
    format!("COPY {table} ({}) FROM STDIN", columns.join(", "))
}

/// The live job holding `key` (or, `with_failed`, a failed job with it).
pub(crate) fn live_job_with_key(t: &Table, key: &str, with_failed: bool) -> Statement {
    let key_column = t.key_column.clone().unwrap_or_default();
    let q = Query::select()
        .expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(ENQUEUE_ALIAS),
            quote(&t.columns.id)
        )))
        .from(enqueue_target(t))
        .and_where(col(ENQUEUE_ALIAS, &key_column).eq(key))
        .and_where(Expr::cust(format!(
            "{}.{}",
            quote(ENQUEUE_ALIAS),
            key_states(&t.columns.state, with_failed)
        )))
        .limit(1)
        .to_owned();
    Statement::from(&q)
}

/// Plans (never runs) a keyed insert: fails when no unique index matches the
/// `ON CONFLICT` target, so a missing index is reported at start-up.
pub(crate) fn explain_keyed_insert(t: &Table) -> Statement {
    let key_column = t.key_column.clone().unwrap_or_default();
    let mut q = Query::insert();
    q.into_table(enqueue_target(t))
        .columns([alias(&key_column)])
        .values_panic([Expr::cust("NULL")]);
    let mut conflict = OnConflict::column(alias(&key_column));
    conflict
        .target_and_where(Expr::cust(key_live_states(&t.columns.state)))
        .do_nothing();
    q.on_conflict(conflict);
    let (sql, values) = q.build_sqlx(PostgresQueryBuilder);
    Statement {
        sql: format!("EXPLAIN {sql}").into(),
        values,
    }
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{enqueue_target, keyed, payload, quoted_enqueue_target, row};
    let e = enqueue_target();
    let (payload_a, payload_p) = (payload("a"), payload("p"));
    let keyed = keyed(&payload_p);
    let cost_3 = [("cost".to_owned(), sea_query::Value::from(3))];
    let flags = ["gpu".to_owned(), "slow".to_owned()];
    let typed_args = sea_query::Value::Json(Some(Box::new(serde_json::json!({"to": "a@b.c"}))));
    let typed = Table {
        kind_column: Some("kind".into()),
        payload_column: Some("args".into()),
        ..enqueue_target()
    };
    let quoted = quoted_enqueue_target();
    vec![
        (
            "enqueue_rows",
            enqueue_rows(
                &e,
                &[
                    JobRow {
                        priority: Some(2),
                        max_retries: Some(1),
                        ..row(&payload_a)
                    },
                    JobRow {
                        run_at: Some(RunAt::After(Duration::from_secs(5))),
                        flags: Some(&flags),
                        ..row(&cost_3)
                    },
                ],
            ),
        ),
        (
            "enqueue_rows_typed",
            enqueue_rows(
                &typed,
                &[JobRow {
                    kind: Some("send_email"),
                    payload: Some(&typed_args),
                    queue: Some("emails"),
                    ..row(&[])
                }],
            ),
        ),
        (
            "enqueue_keyed_replace",
            enqueue_keyed(&e, &keyed, "k", OnKey::Replace),
        ),
        (
            "enqueue_keyed_preserve_run_at",
            enqueue_keyed(&e, &keyed, "k", OnKey::PreserveRunAt),
        ),
        (
            "enqueue_keyed_replace_side_progress",
            enqueue_keyed(
                &Table {
                    progress_table: Some(super::fixtures::rel("app.example_jobs_progress")),
                    ..enqueue_target()
                },
                &keyed,
                "k",
                OnKey::Replace,
            ),
        ),
        (
            "enqueue_keyed_dedupe_only",
            enqueue_keyed(&e, &keyed, "k", OnKey::DedupeOnly),
        ),
        (
            "enqueue_keyed_unsafe_dedupe",
            enqueue_keyed(&e, &keyed, "k", OnKey::UnsafeDedupe),
        ),
        ("release_key", release_key(&e, "k")),
        ("live_job_with_key", live_job_with_key(&e, "k", false)),
        (
            "live_job_with_key_or_failed",
            live_job_with_key(&e, "k", true),
        ),
        ("explain_keyed_insert", explain_keyed_insert(&e)),
        (
            "enqueue_rows_quoted",
            enqueue_rows(&quoted, &[row(&payload_p)]),
        ),
        (
            "enqueue_keyed_quoted",
            enqueue_keyed(&quoted, &row(&payload_p), "k", OnKey::Replace),
        ),
    ]
}
