//! Queue depth and age: the gauges the store and the dashboard read.

use super::{Statement, col, state, table_ref};
use crate::columns::{Columns, Relation, quote};
use crate::sql::table::StoreParams;
use sea_query::{Condition, Expr, ExprTrait, Query};
use sea_query_sqlx::SqlxValues;
use workerutil::JobState;

/// How many jobs wait (queued, or errored awaiting a retry). Served by the
/// partial index on those states, not a scan of the whole table.
pub(crate) fn queued_count(o: &StoreParams) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let q = Query::select()
        .expr(Expr::cust("count(*)::bigint"))
        .from(table_ref(t))
        .cond_where(waiting(&t.alias, c))
        .to_owned();
    Statement::from(&q)
}

/// Whether any job waits: stops at the first row.
pub(crate) fn any_queued(o: &StoreParams) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let inner = Query::select()
        .expr(Expr::val(1))
        .from(table_ref(t))
        .cond_where(waiting(&t.alias, c))
        .limit(1)
        .to_owned();
    let q = Query::select().expr(Expr::exists(inner)).to_owned();
    Statement::from(&q)
}

/// Seconds the longest-waiting due job has been runnable (0 when none), by
/// the database clock: since it was queued or, if later, since its
/// `process_after` (a requeued week-old job has waited since its requeue).
pub(crate) fn max_age_in_queue(o: &StoreParams) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let q = Query::select()
        .expr(Expr::cust(runnable_age(&quote(&t.alias), c)))
        .from(table_ref(t))
        .cond_where(waiting(&t.alias, c))
        .to_owned();
    Statement::from(&q)
}

/// Queued or errored (due or not), through the live index on the HOT layout.
fn waiting(a: &str, c: &Columns) -> Condition {
    super::live(
        Condition::all()
            .add(col(a, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)])),
        a,
        c,
    )
}

/// Seconds since the longest-waiting due row of alias `a` became runnable:
/// `greatest(queued_at, process_after)`, over the rows already due.
fn runnable_age(a: &str, c: &Columns) -> String {
    let (queued_at, after) = (quote(&c.queued_at), quote(&c.process_after));
    format!(
        "COALESCE(EXTRACT(EPOCH FROM now() - min(GREATEST({a}.{queued_at}, {a}.{after})) FILTER (WHERE COALESCE({a}.{after}, '-infinity') <= now())), 0)::float8"
    )
}

/// Live rows per state (and queue): `(state, queue, count, oldest)` with the
/// age in seconds of the longest-runnable waiting job (of the oldest
/// `queued_at` for processing rows). Two branches, each matching one partial
/// index (waiting, processing), so the cost follows the live rows, never the
/// finished ones.
pub(crate) fn queue_stats(o: &StoreParams) -> Statement {
    live_stats(&o.table, &o.columns, o.queue_column.as_deref())
}

fn live_stats(t: &Relation, c: &Columns, queue_column: Option<&str>) -> Statement {
    let a = quote(&t.alias);
    let queue = match queue_column {
        Some(column) => format!("{a}.{}::text", quote(column)),
        None => "NULL::text".to_owned(),
    };
    let branch = |states: &str| {
        format!(
            "SELECT {a}.{state}::text AS \"state\", {queue} AS \"queue\", count(*)::bigint AS \"count\", \
             {oldest} AS \"oldest\" \
             FROM {table} AS {a} WHERE {a}.{state} IN ({states}){live} GROUP BY 1, 2",
            live = super::and_live(&a, c),
            state = quote(&c.state),
            oldest = if states.contains("queued") {
                runnable_age(&a, c)
            } else {
                format!(
                    "COALESCE(EXTRACT(EPOCH FROM now() - min({a}.{})), 0)::float8",
                    quote(&c.queued_at)
                )
            },
            table = t.quoted(),
        )
    };
    Statement {
        sql: format!(
            "{} UNION ALL {} ORDER BY 1, 2",
            branch("'queued', 'errored'"),
            branch("'processing'")
        )
        .into(),
        values: SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let t = super::fixtures::resolved(false);
    let hot = super::fixtures::on_hot_layout(t.clone());
    vec![
        ("queued_count", queued_count(&t)),
        ("any_queued", any_queued(&t)),
        ("max_age_in_queue", max_age_in_queue(&t)),
        ("queue_stats", queue_stats(&super::fixtures::paused())),
        ("queued_count_hot", queued_count(&hot)),
        ("queue_stats_hot", queue_stats(&hot)),
    ]
}
