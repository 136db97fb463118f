//! The claim's candidates under priority aging: the priority levels waiting,
//! the head of each level ranked by how far its wait raised it, and the rows
//! locked in that order. Nothing is written but the claim itself.

use super::claim::{cte, lock_skip, order_select};
use super::{StoreParams, alias, col, eligible, quote, table_ref};
use crate::sql::control::{not_paused, not_paused_text};
use crate::sql::table::AgingParams;
use sea_query::{Expr, ExprTrait, Func, JoinType, Order, Query, SelectStatement, WithClause};

/// The most priority levels an aging claim looks at, among those with jobs
/// due and not paused; lower levels wait for the ones above to drain, as
/// without aging. The walk does not apply a worker's `pre_dequeue`
/// conditions: with more than 32 levels of others' jobs above its own, such
/// a worker waits for them to drain.
pub(crate) const MAX_AGING_LEVELS: u32 = 32;

/// Adds the levels and lanes to `with`, and returns the candidate select:
/// up to `limit` rows in the order of their effective priority (highest
/// first), then of how far they rose, then of the table's order, locked with
/// `SKIP LOCKED`. Each candidate carries `eff` and `boost`, by which the
/// claimed rows are returned.
pub(super) fn aging_candidates(
    o: &StoreParams,
    aging: &AgingParams,
    priority: &str,
    conditions: &[Expr],
    limit: u64,
    with: &mut WithClause,
) -> SelectStatement {
    let (t, c) = (&o.table, &o.columns);
    let a = quote(&t.alias);
    let p = quote(priority);
    // Levels of rows a claim could take now: due, and not paused (levels
    // made only of later or paused jobs would fill the walk's 32 and hide
    // the due ones below them).
    let paused = not_paused_text(o, &t.alias);
    let waiting = format!(
        "{a}.{state} IN ('queued', 'errored'){live} AND ({a}.{after} IS NULL OR {a}.{after} <= now()){pause}",
        state = quote(&c.state),
        live = super::and_live(&a, c),
        after = quote(&c.process_after),
        pause = paused
            .as_ref()
            .map(|(text, _)| format!(" AND {text}"))
            .unwrap_or_default(),
    );
    // The levels waiting, highest first: a loose index scan, one probe each.
    let levels = format!(
        "ARRAY(WITH RECURSIVE \"l\"(\"p\", \"n\") AS (\
         (SELECT {a}.{p}, 1 FROM {table} WHERE {waiting} ORDER BY {a}.{p} DESC LIMIT 1) \
         UNION ALL SELECT (SELECT {a}.{p} FROM {table} WHERE {waiting} AND {a}.{p} < \"l\".\"p\" ORDER BY {a}.{p} DESC LIMIT 1), \"l\".\"n\" + 1 \
         FROM \"l\" WHERE \"l\".\"p\" IS NOT NULL AND \"l\".\"n\" < {MAX_AGING_LEVELS}) \
         SELECT \"p\" FROM \"l\" WHERE \"p\" IS NOT NULL)",
        table = format!("{} AS {a}", t.quoted()),
    );
    let levels = match paused {
        Some((_, key)) => Expr::cust_with_values(levels, [key]),
        None => Expr::cust(levels),
    };
    let mut level_select = Query::select();
    level_select.expr_as(levels, alias("levels"));
    with.cte(cte(level_select, "dbworker_levels", true));

    // A job's effective priority: its own, raised a level per interval
    // waited since it became runnable, at most max_boost, never above the top.
    let waited = format!(
        "floor(EXTRACT(EPOCH FROM now() - greatest({a}.{}, {a}.{})) / $1)::bigint",
        quote(&c.queued_at),
        quote(&c.process_after)
    );
    let boost = match aging.max_boost {
        Some(max) => format!("least({waited}, {max})"),
        None => waited,
    };
    // The top level is read from the CTE, not the lateral's left side, which
    // a lateral in a join may not name past the comma.
    let eff = format!("least((SELECT \"levels\"[1] FROM \"dbworker_levels\"), {a}.{p} + {boost})");
    let mut lane = Query::select();
    lane.expr_as(col(&t.alias, &c.id), alias("id"))
        .expr_as(
            Expr::cust_with_values(eff.clone(), [aging.interval_secs]),
            alias("eff"),
        )
        .expr_as(
            Expr::cust_with_values(format!("{eff} - {a}.{p}"), [aging.interval_secs]),
            alias("boost"),
        )
        .expr_as(col(&t.alias, priority), alias("prio"))
        .from(table_ref(t))
        .cond_where(eligible(&t.alias, c))
        // `<=`, not `=`: the scan then starts at the level as the plain
        // claim's does, and stays an index scan in order when statistics
        // taken of an empty table call a level one row (an equality was then
        // read by a bitmap scan and sorted whole). Rows of lower levels that
        // fill the lane are dropped by the lanes' filter.
        .and_where(Expr::cust(format!("{a}.{p} <= \"dbworker_level\"")));
    for cond in conditions {
        lane.and_where(cond.clone());
    }
    if let Some(e) = not_paused(o, &t.alias) {
        lane.and_where(e);
    }
    order_select(&mut lane, &o.order_by);
    lane.limit(limit + o.candidate_window as u64);
    let mut lanes = Query::select();
    lanes
        .columns([
            (alias("dbworker_lane"), alias("id")),
            (alias("dbworker_lane"), alias("eff")),
            (alias("dbworker_lane"), alias("boost")),
        ])
        .from(alias("dbworker_levels"))
        .from_function(
            Func::cust("unnest").arg(Expr::col((alias("dbworker_levels"), alias("levels")))),
            alias("dbworker_level"),
        )
        .join_lateral(
            JoinType::InnerJoin,
            lane,
            alias("dbworker_lane"),
            Expr::cust("TRUE"),
        )
        .and_where(Expr::cust(
            "\"dbworker_lane\".\"prio\" = \"dbworker_level\"",
        ));
    with.cte(cte(lanes, "dbworker_lanes", true));

    let mut cand = Query::select();
    cand.expr_as(col(&t.alias, &c.id), alias("id"))
        .expr_as(col("dbworker_lanes", "eff"), alias("eff"))
        .expr_as(col("dbworker_lanes", "boost"), alias("boost"))
        .from(table_ref(t))
        .inner_join(
            alias("dbworker_lanes"),
            col("dbworker_lanes", "id").equals((alias(&t.alias), alias(&c.id))),
        )
        .cond_where(eligible(&t.alias, c))
        .order_by(("dbworker_lanes", "eff"), Order::Desc)
        .order_by(("dbworker_lanes", "boost"), Order::Desc);
    order_select(&mut cand, &o.order_by);
    cand.limit(limit);
    lock_skip(&mut cand, &t.alias);
    cand
}
