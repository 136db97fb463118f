//! The reset of stalled (and orphaned) jobs: one atomic statement.

use super::claim::cte;
use super::{Statement, alias, col, processing, reset_or_fail, state, table_ref};
use crate::columns::{Columns, Relation, quote};
use crate::sql::history::ErrorHistory;
use sea_query::{Condition, Expr, ExprTrait, LockBehavior, LockType, Query, WithClause};
use workerutil::JobState;

/// The resetter's pass, in one atomic statement: processing rows whose
/// heartbeat is older than the stalled max age and that no live transaction
/// locks go back to `queued` (num_resets + 1), or to `failed` once they were
/// reset `max_num_resets` times; each appends to the error history, if kept. Returns `(id, new state, heartbeat age in s)`.
pub(crate) fn reset_stalled(
    t: &Relation,
    c: &Columns,
    stalled_max_age_secs: f64,
    dead_nodes: Option<&(Relation, std::time::Duration)>,
    max_num_resets: u32,
    message: &str,
    history: Option<&ErrorHistory>,
) -> Statement {
    let a = &t.alias;
    let mut stalled_or_orphaned = Condition::any()
        .add(col(a, &c.last_heartbeat_at).is_null())
        .add(col(a, &c.last_heartbeat_at).lt(Expr::cust_with_values(
            "now() - make_interval(secs => $1::float8)",
            [stalled_max_age_secs],
        )));
    if let Some((nodes, dead_after)) = dead_nodes {
        // The job's process is known dead: no need to wait for its heartbeat
        // to age to the stalled max age (the fencing token still guards
        // against a stale writer). Its own heartbeat must have stopped too,
        // for as long: a registry row goes stale while the process still
        // beats its jobs (its registry beat stuck on a lock, a connection),
        // and requeueing those would run them twice at once.
        stalled_or_orphaned = stalled_or_orphaned.add(Expr::cust_with_values(
            format!(
                "({a}.{h} < now() - make_interval(secs => $1::float8) AND {a}.{w} IN (SELECT \"n\".\"id\" FROM {n} AS \"n\" WHERE \"n\".\"heartbeat_at\" < now() - make_interval(secs => $1::float8)))",
                a = quote(a),
                h = quote(&c.last_heartbeat_at),
                w = quote(&c.worker_hostname),
                n = nodes.quoted()
            ),
            [dead_after.as_secs_f64()],
        ));
    }
    let stalled = Query::select()
        .expr_as(col(a, &c.id), alias("id"))
        .from(table_ref(t))
        .cond_where(processing(a, c))
        .cond_where(stalled_or_orphaned)
        .lock_with_tables_behavior(LockType::Update, [alias(a)], LockBehavior::SkipLocked)
        .to_owned();
    let mut update = Query::update();
    update.table(table_ref(t));
    let history = history.map(|h| (h, "reset: the job's heartbeat stopped (stalled)"));
    reset_or_fail(&mut update, a, c, max_num_resets, message, history);
    let update = update
        .value(alias(&c.worker_hostname), "")
        .from(alias("dbworker_stalled"))
        .and_where(col(a, &c.id).equals(("dbworker_stalled", "id")))
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
        .returning(Query::returning().exprs([
            Expr::cust(format!("{}.{}::bigint AS \"id\"", quote(a), quote(&c.id))),
            Expr::cust(format!(
                "{}.{}::text AS \"state\"",
                quote(a),
                quote(&c.state)
            )),
            Expr::cust(format!(
                "COALESCE(EXTRACT(EPOCH FROM now() - {}.{}), 0)::float8 AS \"age\"",
                quote(a),
                quote(&c.last_heartbeat_at)
            )),
        ]))
        .to_owned();
    let with = WithClause::new()
        .cte(cte(stalled, "dbworker_stalled", true))
        .to_owned();
    Statement::from(&update.with(with))
}

/// The statement above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{error_history, on_hot_layout, quoted, resolved};
    let (t, o) = (resolved(false), quoted());
    let nodes = (
        Relation::parse("node_table", "dbworker_nodes").unwrap(),
        std::time::Duration::from_secs(10),
    );
    let (c, h) = (&t.columns, error_history());
    vec![
        (
            "reset_stalled",
            reset_stalled(&t.table, c, 5.0, None, 3, "m", None),
        ),
        (
            "reset_stalled_hot",
            reset_stalled(
                &t.table,
                &on_hot_layout(resolved(false)).columns,
                5.0,
                None,
                3,
                "m",
                None,
            ),
        ),
        (
            "reset_stalled_with_history",
            reset_stalled(&t.table, c, 5.0, None, 3, "m", Some(&h)),
        ),
        (
            "reset_stalled_or_orphaned",
            reset_stalled(&t.table, c, 5.0, Some(&nodes), 3, "m", None),
        ),
        (
            "reset_stalled_quoted",
            reset_stalled(&o.table, &o.columns, 5.0, None, 3, "m", None),
        ),
    ]
}
