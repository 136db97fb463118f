//! Grouped marks (heartbeat handling): many claimed jobs' outcomes in one
//! statement, each doing what its own mark in `marks.rs` would, each fenced
//! by its own token.

use super::claim::cte;
use super::marks::{drop_checkpoint, max_retries, retry_delay};
use super::{Statement, alias, col, processing_by_id, state, table_ref, token_expr};
use crate::columns::{TRACE_FOLLOWS, quote};
use crate::message::sanitize_failure_message;
use crate::retry::RetryRule;
use crate::sql::history::appended;
use crate::sql::table::StoreParams;
use sea_query::{Condition, Expr, ExprTrait, IntoIden, Query, TableRef, WithClause};
use workerutil::JobState;

/// What a grouped mark does to one job: what [`mark_complete`](super::marks::mark_complete),
/// [`mark_errored`](super::marks::mark_errored) or [`mark_failed`](super::marks::mark_failed) would do to it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkKind {
    Complete,
    Errored,
    Failed,
}

impl MarkKind {
    fn as_str(self) -> &'static str {
        match self {
            MarkKind::Complete => "complete",
            MarkKind::Errored => "errored",
            MarkKind::Failed => "failed",
        }
    }
}

/// One job of a grouped mark.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) id: i64,
    pub(crate) token: i64,
    pub(crate) kind: MarkKind,
    pub(crate) message: String,
    /// A completion's result as JSON text; `''` for none.
    pub(crate) result: String,
    /// The span the attempt ran under (`traceparent`), `''` for none: every
    /// mark records it for the next attempt and the dependents it releases
    /// (a table with traces).
    pub(crate) span: String,
}

/// Completes many claimed jobs in one statement (heartbeat handling, a group
/// of completions only: the common case, planned once and cached). With a
/// result column, each writes its result (JSON text, `''` for none) too;
/// with traces, the span its attempt ran under (`''` for none), which a
/// dependent it releases links to.
/// Returns the ids that were marked, each with the state it got; any other
/// was no longer ours.
pub(crate) fn complete_group(
    o: &StoreParams,
    ids: Vec<i64>,
    tokens: Vec<i64>,
    (results, spans): (Vec<String>, Vec<String>),
) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let mut marks = Query::select()
        .expr_as(
            Expr::cust_with_values("unnest($1::bigint[])", [ids]),
            alias("id"),
        )
        .expr_as(
            Expr::cust_with_values("unnest($1::bigint[])", [tokens]),
            alias("token"),
        )
        .to_owned();
    let mut q = Query::update();
    drop_checkpoint(&mut q, o);
    if let Some(column) = &o.result_column {
        marks.expr_as(
            Expr::cust_with_values("unnest($1::text[])", [results]),
            alias("result"),
        );
        q.value(alias(column), grouped_result(a, column));
    }
    if o.traces {
        marks.expr_as(
            Expr::cust_with_values("unnest($1::text[])", [spans]),
            alias("span"),
        );
        q.value(alias(TRACE_FOLLOWS), grouped_span(a));
    }
    let q = q
        .table(table_ref(t))
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .from(TableRef::SubQuery(
            Box::new(marks),
            alias("dbworker_marks").into_iden(),
        ))
        .and_where(col(a, &c.id).equals(("dbworker_marks", "id")))
        .and_where(processing_by_id(a, c))
        .and_where(token_expr(a, c).equals(("dbworker_marks", "token")))
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(a),
            quote(&c.id)
        ))))
        .to_owned();
    super::progress_table::completion(q, o)
}

/// Marks many claimed jobs in one statement (heartbeat handling): each gets
/// what its own mark would do, and only while its lease still owns the row.
/// Its errored marks share `retry` (the completer groups marks by rule).
/// Returns the ids that were marked; any other was no longer ours.
pub(crate) fn mark_group(o: &StoreParams, marks: &[Mark], retry: &RetryRule) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let q = |name: &str| format!("{}.{}", quote(a), quote(name));
    let failures = format!("COALESCE({}, 0)", q(&c.num_failures)); // see counter()
    let cancel = format!("COALESCE({}, false)", q(&c.cancel));
    let mut marks_q = Query::select()
        .expr_as(
            Expr::cust_with_values(
                "unnest($1::bigint[])",
                [marks.iter().map(|m| m.id).collect::<Vec<_>>()],
            ),
            alias("id"),
        )
        .expr_as(
            Expr::cust_with_values(
                "unnest($1::bigint[])",
                [marks.iter().map(|m| m.token).collect::<Vec<_>>()],
            ),
            alias("token"),
        )
        .expr_as(
            Expr::cust_with_values(
                "unnest($1::text[])",
                [marks
                    .iter()
                    .map(|m| m.kind.as_str().to_owned())
                    .collect::<Vec<_>>()],
            ),
            alias("kind"),
        )
        .expr_as(
            Expr::cust_with_values(
                "unnest($1::text[])",
                [marks
                    .iter()
                    .map(|m| sanitize_failure_message(&m.message).into_owned())
                    .collect::<Vec<_>>()],
            ),
            alias("message"),
        )
        .to_owned();
    let kind_is = |k: MarkKind| format!("\"dbworker_marks\".\"kind\" = '{}'", k.as_str());
    let exhausted =
        Expr::cust(format!("{failures} + 1")).gt(max_retries(o, a, retry.max_num_retries));
    let retry_now = Condition::all()
        .add(Expr::cust(kind_is(MarkKind::Errored)))
        .add(Expr::cust(format!("NOT {cancel}")))
        .add(exhausted.clone().not());
    let mut update = Query::update();
    if o.traces {
        marks_q.expr_as(
            Expr::cust_with_values(
                "unnest($1::text[])",
                [marks.iter().map(|m| m.span.clone()).collect::<Vec<_>>()],
            ),
            alias("span"),
        );
        update.value(alias(TRACE_FOLLOWS), grouped_span(a));
    }
    if let Some(column) = &o.result_column {
        // Only completions carry a result; the others write `''`.
        marks_q.expr_as(
            Expr::cust_with_values(
                "unnest($1::text[])",
                [marks.iter().map(|m| m.result.clone()).collect::<Vec<_>>()],
            ),
            alias("result"),
        );
        update.value(alias(column), grouped_result(a, column));
    }
    // A completion drops its checkpoint, as alone (the side table's below).
    if o.progress {
        update.value(
            alias(crate::columns::CHECKPOINT),
            Expr::case(Expr::cust(kind_is(MarkKind::Complete)), Expr::cust("NULL"))
                .finally(col(a, crate::columns::CHECKPOINT)),
        );
    }
    if let Some(h) = &o.error_history {
        // Completions keep the history as it is; every other mark appends.
        update.value(
            alias(&h.column),
            Expr::case(Expr::cust(kind_is(MarkKind::Complete)), col(a, &h.column))
                .finally(appended(h, a, c, col("dbworker_marks", "message"))),
        );
    }
    let update = update
        .table(table_ref(t))
        .value(
            alias(&c.state),
            Expr::case(
                Expr::cust(kind_is(MarkKind::Complete)),
                state(JobState::Completed),
            )
            .case(Expr::cust(cancel.clone()), state(JobState::Canceled))
            .case(
                Condition::any()
                    .add(Expr::cust(kind_is(MarkKind::Failed)))
                    .add(exhausted),
                state(JobState::Failed),
            )
            .finally(state(JobState::Errored)),
        )
        .value(
            alias(&c.process_after),
            Expr::case(
                retry_now,
                Expr::cust("now()").add(retry_delay(a, c, &retry.policy)),
            )
            .finally(col(a, &c.process_after)),
        )
        .value(
            alias(&c.num_failures),
            Expr::case(
                Expr::cust(kind_is(MarkKind::Complete)),
                col(a, &c.num_failures),
            )
            .finally(Expr::cust(format!("{failures} + 1"))),
        )
        .value(
            alias(&c.failure_message),
            Expr::case(
                Expr::cust(kind_is(MarkKind::Complete)),
                col(a, &c.failure_message),
            )
            .finally(col("dbworker_marks", "message")),
        )
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .from(alias("dbworker_marks"))
        .and_where(col(a, &c.id).equals(("dbworker_marks", "id")))
        .and_where(processing_by_id(a, c))
        .and_where(token_expr(a, c).equals(("dbworker_marks", "token")))
        .returning(Query::returning().exprs([
            Expr::cust(format!("{}::bigint AS \"id\"", q(&c.id))),
            Expr::cust(format!("{}::text AS \"state\"", q(&c.state))),
        ]))
        .to_owned();
    let with = WithClause::new()
        .cte(cte(marks_q, "dbworker_marks", true))
        .to_owned();
    match &o.progress_table {
        // The side rows of the jobs it completed lose their checkpoint.
        Some(side) => super::progress_table::checkpoints_dropped(
            update,
            with,
            side,
            &["id", "state"],
            Some("state"),
        ),
        None => Statement::from(&update.with(with)),
    }
}

/// What a grouped mark writes to `trace_follows`: the mark's span, or with
/// none (`''`) what the row holds.
fn grouped_span(a: &str) -> Expr {
    Expr::cust(format!(
        "COALESCE(NULLIF(\"dbworker_marks\".\"span\", ''), {}.{})",
        quote(a),
        quote(TRACE_FOLLOWS)
    ))
}

/// The value a grouped completion writes to the result column: the mark's
/// result (JSON text, `''` for none) or, with none, what the row holds.
fn grouped_result(a: &str, result_column: &str) -> Expr {
    Expr::cust(format!(
        "CASE WHEN \"dbworker_marks\".\"result\" = '' THEN {}.{} ELSE \"dbworker_marks\".\"result\"::jsonb END",
        quote(a),
        quote(result_column)
    ))
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{resolved, with_history, with_results, with_traces};
    let (t, r, h) = (resolved(false), with_results(), with_history());
    let mark = |kind, message: &str, result: &str| Mark {
        id: 1,
        token: 2,
        kind,
        message: message.into(),
        result: result.into(),
        span: String::new(),
    };
    let errored = [mark(MarkKind::Errored, "m", "")];
    let completed = [mark(MarkKind::Complete, "", "{\"n\": 1}")];
    let failed = [mark(MarkKind::Failed, "m", "")];
    let rule = t.retry_rule(None);
    let mut progress = t.clone();
    progress.progress = true;
    let mut side = t.clone();
    side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
    vec![
        ("mark_group", mark_group(&t, &errored, &rule)),
        (
            "mark_group_hot",
            mark_group(&super::fixtures::on_hot_layout(t.clone()), &errored, &rule),
        ),
        (
            "complete_group_hot",
            complete_group(
                &super::fixtures::on_hot_layout(t.clone()),
                vec![1],
                vec![2],
                (vec![String::new()], vec![]),
            ),
        ),
        (
            "mark_group_with_traces",
            mark_group(&with_traces(), &errored, &rule),
        ),
        (
            "complete_group",
            complete_group(&t, vec![1], vec![2], (vec![String::new()], vec![])),
        ),
        (
            "complete_group_with_results",
            complete_group(
                &r,
                vec![1, 3],
                vec![2, 4],
                (vec!["{}".into(), String::new()], vec![]),
            ),
        ),
        (
            "complete_group_with_traces",
            complete_group(
                &with_traces(),
                vec![1],
                vec![2],
                (
                    vec![String::new()],
                    vec!["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()],
                ),
            ),
        ),
        (
            "mark_group_with_results",
            mark_group(&r, &completed, &r.retry_rule(None)),
        ),
        (
            "mark_group_with_history",
            mark_group(&h, &failed, &h.retry_rule(None)),
        ),
        (
            "mark_group_with_progress",
            mark_group(&progress, &completed, &rule),
        ),
        (
            "mark_group_with_progress_table",
            mark_group(&side, &completed, &rule),
        ),
    ]
}
