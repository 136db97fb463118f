//! Fair claims: the start-up look for the tagging triggers, the weight
//! table's rows, and each key's share of what waits and runs.

use super::{Statement, Table, alias, col, plain_table, state, table_ref};
use crate::columns::{
    FAIR_KEY, FAIR_TAG, FAIR_UNTAGGED, Relation, fair_due_trigger, fair_triggers,
};
use sea_query::{Expr, ExprTrait, OnConflict, Order, Query};
use workerutil::JobState;

/// The names of `table`'s tagging triggers that exist (the due trigger's
/// too): `(name)` rows.
pub(crate) fn fair_trigger_names(table: &Relation) -> Statement {
    let mut names: Vec<String> = fair_triggers(table).to_vec();
    names.push(fair_due_trigger(table));
    let q = Query::select()
        .expr_as(Expr::cust("tgname::text"), alias("name"))
        .from(alias("pg_trigger"))
        .and_where(Expr::cust_with_values(
            "tgrelid = to_regclass($1::text) AND tgname = ANY($2::text[])",
            [
                sea_query::Value::from(table.quoted()),
                sea_query::Value::from(names),
            ],
        ))
        .to_owned();
    Statement::from(&q)
}

/// Asks the tagging trigger to tag up to `limit` untagged jobs of `t` that
/// have come due, earliest first (`fair_tag = -1` fires it); rows another
/// worker is tagging are skipped. Returns how many.
pub(crate) fn tag_come_due(t: &Table, limit: u64) -> Statement {
    let (a, c) = (&t.table.alias, &t.columns);
    let due = Query::select()
        .column((alias(a), alias(&c.id)))
        .from(table_ref(&t.table))
        .and_where(col(a, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]))
        // A literal, so the planner proves the untagged jobs' partial index.
        .and_where(Expr::cust(format!(
            "{}.{} >= {FAIR_UNTAGGED}",
            crate::columns::quote(a),
            crate::columns::quote(FAIR_TAG)
        )))
        // No run-at is due too: an operator's requeue of a job waiting out
        // its backoff, or a keyed replacement without one, clears it while
        // the job stays waiting (the update trigger does not fire).
        .and_where(Expr::cust(format!(
            "({a}.{p} <= now() OR {a}.{p} IS NULL)",
            a = crate::columns::quote(a),
            p = crate::columns::quote(&c.process_after)
        )))
        .order_by((alias(a), alias(&c.process_after)), Order::Asc)
        .limit(limit)
        .lock_with_behavior(
            sea_query::LockType::Update,
            sea_query::LockBehavior::SkipLocked,
        )
        .to_owned();
    let q = Query::update()
        .table(table_ref(&t.table))
        .value(alias(FAIR_TAG), Expr::val(-1i64))
        .and_where(col(a, &c.id).in_subquery(due))
        .to_owned();
    Statement::from(&q)
}

/// Sets one key's weight.
pub(crate) fn set_fair_weight(weights: &Relation, key: &str, weight: i32) -> Statement {
    let q = Query::insert()
        .into_table(plain_table(weights))
        .columns([alias(FAIR_KEY), alias("weight")])
        .values_panic([Expr::val(key), Expr::val(weight)])
        .on_conflict(
            OnConflict::column(alias(FAIR_KEY))
                .update_column(alias("weight"))
                .to_owned(),
        )
        .to_owned();
    Statement::from(&q)
}

/// Removes one key's weight (back to 1).
pub(crate) fn remove_fair_weight(weights: &Relation, key: &str) -> Statement {
    let q = Query::delete()
        .from_table(plain_table(weights))
        .and_where(Expr::col(alias(FAIR_KEY)).eq(key))
        .to_owned();
    Statement::from(&q)
}

/// Every key's weight: `(fair_key, weight)` by key.
pub(crate) fn list_fair_weights(weights: &Relation) -> Statement {
    let q = Query::select()
        .columns([alias(FAIR_KEY), alias("weight")])
        .from(plain_table(weights))
        .order_by(alias(FAIR_KEY), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The keys with work, most waiting first: `(fair_key, waiting, processing,
/// weight)`, at most `limit` rows.
pub(crate) fn fair_shares(t: &Table, weights: &Relation, limit: u64) -> Statement {
    let (a, c) = (&t.table.alias, &t.columns);
    let waiting = format!(
        "count(*) FILTER (WHERE {}.{} IN ('queued', 'errored'))",
        super::quote(a),
        super::quote(&c.state)
    );
    let q = Query::select()
        .expr_as(col(a, FAIR_KEY), alias(FAIR_KEY))
        .expr_as(Expr::cust(format!("{waiting}::bigint")), alias("waiting"))
        .expr_as(
            Expr::cust(format!(
                "count(*) FILTER (WHERE {}.{} = 'processing')::bigint",
                super::quote(a),
                super::quote(&c.state)
            )),
            alias("processing"),
        )
        .expr_as(
            Expr::cust(format!(
                "coalesce(max({}.\"weight\"), 1)",
                super::quote(&weights.alias)
            )),
            alias("weight"),
        )
        .from(table_ref(&t.table))
        .left_join(
            table_ref(weights),
            col(&weights.alias, FAIR_KEY).equals((alias(a), alias(FAIR_KEY))),
        )
        .and_where(col(a, &c.state).is_in([
            state(JobState::Queued),
            state(JobState::Errored),
            state(JobState::Processing),
        ]))
        .group_by_col((alias(a), alias(FAIR_KEY)))
        .order_by_expr(Expr::cust(waiting), Order::Desc)
        .order_by((alias(a), alias(FAIR_KEY)), Order::Asc)
        .limit(limit)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::resolved;
    let t = resolved(false);
    let weights = crate::columns::fair_weights_table(&t.table);
    vec![
        ("fair_trigger_names", fair_trigger_names(&t.table)),
        ("set_fair_weight", set_fair_weight(&weights, "acme", 4)),
        ("remove_fair_weight", remove_fair_weight(&weights, "acme")),
        ("list_fair_weights", list_fair_weights(&weights)),
        ("fair_shares", fair_shares(&t, &weights, 20)),
        ("tag_come_due", tag_come_due(&t, 1000)),
    ]
}
