//! The heartbeat: one statement that touches every running job the worker still owns.

use super::claim::cte;
use super::progress_table::heartbeat_side;
use super::{Statement, alias, col, state, table_ref};
use crate::columns::{PROGRESS, PROGRESS_SEQ, quote};
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, LockBehavior, LockType, Query, WithClause};
use workerutil::JobState;

/// Heartbeat: returns `(id, cancel)` for every lease still owned, and touches
/// `last_heartbeat_at` on those rows. The handler's `FOR KEY SHARE` lock does
/// not block this update; a row the handler itself updated (a stronger lock) is
/// skipped rather than waited on, and its lock shows it is alive. `progress`
/// (reported since the last beat, by job) is written to the owned rows it
/// names, each write counted in `progress_seq`.
pub(crate) fn heartbeat(
    o: &StoreParams,
    ids: Vec<i64>,
    tokens: Vec<i64>,
    progress: Vec<(i64, serde_json::Value)>,
) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let owned_q = Query::select()
        .expr_as(col(a, &c.id), alias("id"))
        .expr_as(col(a, &c.cancel), alias("cancel"))
        .from(table_ref(t))
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
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
    let lockable = Query::select()
        .column((alias("dbworker_lock"), alias(&c.id)))
        .from(table_ref(t).alias(alias("dbworker_lock")))
        .and_where(
            col("dbworker_lock", &c.id).in_subquery(
                Query::select()
                    .column(alias("id"))
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
    // One object keyed by job id, bound once: each row finds its value by
    // key (a subquery over an array per row made the beat quadratic in the
    // jobs reporting: 2.6 s at 4,000).
    let reported =
        (!progress.is_empty() && (o.progress || o.progress_table.is_some())).then(|| {
            serde_json::Value::Object(
                progress
                    .into_iter()
                    .map(|(id, value)| (id.to_string(), value))
                    .collect(),
            )
        });
    let mut side = None;
    let mut values = None;
    match (reported, &o.progress_table) {
        // On a table that keeps progress in its side table, the values go
        // there, for the rows this beat touched (owned, and locked by it).
        (Some(reported), Some(table)) => {
            touch.returning(Query::returning().expr(Expr::cust(format!(
                "{}.{}::bigint AS \"id\"",
                quote(a),
                quote(&c.id)
            ))));
            side = Some(heartbeat_side(table, reported, "dbworker_touched"));
        }
        (Some(reported), None) => {
            let key = format!("{}.{}::text", quote(a), quote(&c.id));
            let object = "(SELECT \"v\" FROM \"dbworker_reports\")";
            touch
                .value(
                    alias(PROGRESS),
                    Expr::cust(format!(
                        "COALESCE({object} -> {key}, {}.{})",
                        quote(a),
                        quote(PROGRESS)
                    )),
                )
                .value(
                    alias(PROGRESS_SEQ),
                    Expr::cust(format!(
                        "{}.{} + jsonb_exists({object}, {key})::int",
                        quote(a),
                        quote(PROGRESS_SEQ)
                    )),
                );
            values = Some(
                Query::select()
                    .expr_as(Expr::cust_with_values("$1::jsonb", [reported]), alias("v"))
                    .to_owned(),
            );
        }
        (None, _) => {}
    }
    let mut with = WithClause::new();
    with.cte(cte(owned_q, "dbworker_owned", true));
    if let Some(values) = values {
        with.cte(cte(values, "dbworker_reports", true));
    }
    with.cte(cte(touch, "dbworker_touched", false));
    if let Some(side) = side {
        with.cte(cte(side, "dbworker_reported", false));
    }
    let q = Query::select()
        .expr(Expr::cust("\"dbworker_owned\".\"id\"::bigint AS \"id\""))
        .expr(Expr::cust("\"dbworker_owned\".\"cancel\" AS \"cancel\""))
        .from(alias("dbworker_owned"))
        .to_owned();
    Statement::from(&q.with(with))
}

/// The statement above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let t = super::fixtures::resolved(false);
    let mut p = t.clone();
    p.progress = true;
    let mut side = t.clone();
    side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
    vec![
        ("heartbeat", heartbeat(&t, vec![1], vec![2], Vec::new())),
        (
            "heartbeat_with_progress_table",
            heartbeat(
                &side,
                vec![1],
                vec![2],
                vec![(1, serde_json::json!({"percent": 40}))],
            ),
        ),
        (
            "heartbeat_with_progress",
            heartbeat(
                &p,
                vec![1],
                vec![2],
                vec![(1, serde_json::json!({"percent": 40}))],
            ),
        ),
    ]
}
