//! The heartbeat: one statement that touches every running job the worker still owns.

use super::claim::cte;
use super::progress_table::heartbeat_side;
use super::{Statement, alias, col, processing_by_id, table_ref, token_expr};
use crate::columns::{PROGRESS, PROGRESS_SEQ, TRACE_FOLLOWS, quote};
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, LockBehavior, LockType, Query, WithClause};

/// The heartbeat's column saying a row was written (present only when the
/// beat carried progress or spans): a row it skipped, locked by its handler,
/// keeps its span for the next beat.
pub(crate) const HEARTBEAT_TOUCHED: &str = "touched";

/// The heartbeat's column saying a row's report landed (present only when
/// the beat carried progress): one skipped, or refused by a newer write's
/// number, goes back to its attempt.
pub(crate) const HEARTBEAT_WROTE: &str = "wrote";

/// Heartbeat: returns `(id, cancel)` for every lease still owned, and touches
/// `last_heartbeat_at` on those rows. The handler's `FOR KEY SHARE` lock does
/// not block this update; a row the handler itself updated (a stronger lock) is
/// skipped rather than waited on, and its lock shows it is alive. `progress`
/// (reported since the last beat: job, number, value) is written to the
/// owned rows it names whose `progress_seq` is below its number, which it
/// sets; the result's `wrote` says which landed. With traces, `spans` (the
/// `traceparent` of attempts no beat has recorded yet, by job) go to the
/// owned rows' `trace_follows`, so an attempt whose worker dies without a
/// mark is still linked from the next. With either, the result's `touched`
/// says which of the rows were written. Without progress or spans to write,
/// the statement is the plain one.
pub(crate) fn heartbeat(
    o: &StoreParams,
    ids: Vec<i64>,
    tokens: Vec<i64>,
    progress: Vec<(i64, i64, serde_json::Value)>,
    spans: Vec<(i64, String)>,
) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let owned_q = Query::select()
        .expr_as(col(a, &c.id), alias("id"))
        .expr_as(col(a, &c.cancel), alias("cancel"))
        .expr_as(token_expr(a, c), alias("token"))
        .from(table_ref(t))
        .and_where(processing_by_id(a, c))
        .and_where(Expr::cust_with_values(
            format!(
                "({}.{}::bigint, (EXTRACT(EPOCH FROM {}.{}) * 1000000)::bigint) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[]))",
                quote(a),
                quote(&c.id),
                quote(a),
                quote(&c.started_at)
            ),
            [sea_query::Value::from(ids), sea_query::Value::from(tokens)],
        ))
        .to_owned();
    // `dbworker_owned` read the statement's snapshot; the lock takes the
    // row's newest version and re-checks only this query's own conditions on
    // it, so they test the state and the token again: a mark, or a reset and
    // a new claim, that committed in between leaves the row untouched.
    let lockable = Query::select()
        .column((alias("dbworker_lock"), alias(&c.id)))
        .from(table_ref(t).alias(alias("dbworker_lock")))
        .and_where(processing_by_id("dbworker_lock", c))
        .and_where(
            Expr::tuple([col("dbworker_lock", &c.id), token_expr("dbworker_lock", c)]).in_subquery(
                Query::select()
                    .column(alias("id"))
                    .column(alias("token"))
                    .from(alias("dbworker_owned"))
                    .to_owned(),
            ),
        )
        .lock_with_behavior(LockType::NoKeyUpdate, LockBehavior::SkipLocked)
        .to_owned();
    let mut touch = Query::update()
        .table(table_ref(t))
        .value(alias(&c.last_heartbeat_at), Expr::cust("now()"))
        .and_where(col(a, &c.id).in_subquery(lockable))
        .to_owned();
    // One object keyed by job id, bound once: each row finds its report by
    // key (a subquery over an array per row made the beat quadratic in the
    // jobs reporting: 2.6 s at 4,000). A report is `[number, value]`.
    let reported =
        (!progress.is_empty() && (o.progress || o.progress_table.is_some())).then(|| {
            serde_json::Value::Object(
                progress
                    .into_iter()
                    .map(|(id, number, value)| (id.to_string(), serde_json::json!([number, value])))
                    .collect(),
            )
        });
    // Keyed by job id and bound once, as progress is.
    let spans = (o.traces && !spans.is_empty()).then(|| {
        serde_json::Value::Object(
            spans
                .into_iter()
                .map(|(id, span)| (id.to_string(), serde_json::Value::String(span)))
                .collect(),
        )
    });
    // The rows this beat touched (owned, and locked by it).
    let mut returning_touched = vec![Expr::cust(format!(
        "{}.{}::bigint AS \"id\"",
        quote(a),
        quote(&c.id)
    ))];
    let carries = reported.is_some() || spans.is_some();
    let mut side = None;
    let mut wrote = None;
    let values = reported.map(|reported| {
        Query::select()
            .expr_as(Expr::cust_with_values("$1::jsonb", [reported]), alias("v"))
            .to_owned()
    });
    match (&values, &o.progress_table) {
        // On a table that keeps progress in its side table, the reports go
        // there, for the rows this beat touched, each above the side row's
        // number.
        (Some(_), Some(table)) => {
            side = Some(heartbeat_side(
                table,
                "dbworker_reports",
                "dbworker_touched",
            ));
            wrote = Some("SELECT \"id\" FROM \"dbworker_reported\"");
        }
        // A report lands only above the row's number: a beat given up at its
        // timeout that commits late carries a smaller number than any write
        // sent after it, and changes nothing.
        (Some(_), None) => {
            let key = format!("{}.{}::text", quote(a), quote(&c.id));
            let object = "(SELECT \"v\" FROM \"dbworker_reports\")";
            let number = format!("({object} -> {key} ->> 0)::bigint");
            let seq = format!("{}.{}", quote(a), quote(PROGRESS_SEQ));
            touch
                .value(
                    alias(PROGRESS),
                    Expr::cust(format!(
                        "CASE WHEN {number} > {seq} THEN {object} -> {key} -> 1 ELSE {}.{} END",
                        quote(a),
                        quote(PROGRESS)
                    )),
                )
                .value(
                    alias(PROGRESS_SEQ),
                    Expr::cust(format!("GREATEST({seq}, {number})")),
                );
            // The row's number is this report's only if it landed.
            returning_touched.push(Expr::cust(format!(
                "COALESCE({number} = {seq}, false) AS \"wrote\""
            )));
            wrote = Some("SELECT \"id\" FROM \"dbworker_touched\" WHERE \"wrote\"");
        }
        (None, _) => {}
    }
    let span_values = spans.map(|spans| {
        let key = format!("{}.{}::text", quote(a), quote(&c.id));
        touch.value(
            alias(TRACE_FOLLOWS),
            Expr::cust(format!(
                "COALESCE((SELECT \"v\" FROM \"dbworker_spans\") ->> {key}, {}.{})",
                quote(a),
                quote(TRACE_FOLLOWS)
            )),
        );
        Query::select()
            .expr_as(Expr::cust_with_values("$1::jsonb", [spans]), alias("v"))
            .to_owned()
    });
    let mut q = Query::select()
        .expr(Expr::cust("\"dbworker_owned\".\"id\"::bigint AS \"id\""))
        .expr(Expr::cust("\"dbworker_owned\".\"cancel\" AS \"cancel\""))
        .from(alias("dbworker_owned"))
        .to_owned();
    let mut with = WithClause::new();
    with.cte(cte(owned_q, "dbworker_owned", true));
    if let Some(values) = values {
        with.cte(cte(values, "dbworker_reports", true));
    }
    if let Some(span_values) = span_values {
        with.cte(cte(span_values, "dbworker_spans", true));
    }
    if carries {
        touch.returning(Query::returning().exprs(returning_touched));
        q.expr(Expr::cust(format!(
            "\"dbworker_owned\".\"id\" IN (SELECT \"id\" FROM \"dbworker_touched\") AS \"{HEARTBEAT_TOUCHED}\""
        )));
    }
    if let Some(wrote) = wrote {
        q.expr(Expr::cust(format!(
            "\"dbworker_owned\".\"id\" IN ({wrote}) AS \"{HEARTBEAT_WROTE}\""
        )));
    }
    with.cte(cte(touch, "dbworker_touched", false));
    if let Some(side) = side {
        with.cte(cte(side, "dbworker_reported", false));
    }
    Statement::from(&q.with(with))
}

/// The statement above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let t = super::fixtures::resolved(false);
    let traced = super::fixtures::with_traces();
    let span = || {
        vec![(
            1,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]
    };
    let mut p = t.clone();
    p.progress = true;
    let mut side = t.clone();
    side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
    let mut traced_side = side.clone();
    traced_side.traces = true;
    vec![
        (
            "heartbeat",
            heartbeat(&t, vec![1], vec![2], Vec::new(), Vec::new()),
        ),
        (
            "heartbeat_hot",
            heartbeat(
                &super::fixtures::on_hot_layout(t.clone()),
                vec![1],
                vec![2],
                Vec::new(),
                Vec::new(),
            ),
        ),
        (
            "heartbeat_with_spans",
            heartbeat(&traced, vec![1], vec![2], Vec::new(), span()),
        ),
        (
            "heartbeat_with_progress_table",
            heartbeat(
                &side,
                vec![1],
                vec![2],
                vec![(1, 5, serde_json::json!({"percent": 40}))],
                Vec::new(),
            ),
        ),
        (
            "heartbeat_with_progress_table_and_spans",
            heartbeat(
                &traced_side,
                vec![1],
                vec![2],
                vec![(1, 5, serde_json::json!({"percent": 40}))],
                span(),
            ),
        ),
        (
            "heartbeat_with_progress",
            heartbeat(
                &p,
                vec![1],
                vec![2],
                vec![(1, 5, serde_json::json!({"percent": 40}))],
                Vec::new(),
            ),
        ),
    ]
}
