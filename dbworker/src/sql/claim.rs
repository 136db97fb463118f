//! The claim (phase one of a dequeue: `FOR UPDATE SKIP LOCKED`, setting `processing`
//! and a fresh fencing token), the records it returns, and the row lock of phase two.

use super::aging::aging_candidates;
use super::progress::progress_returning;
use super::{Statement, alias, col, eligible, owned, state, table_ref};
use crate::columns::{Relation, quote};
use crate::columns::{TRACE_FOLLOWS, TRACEPARENT, TRACESTATE};
use crate::sql::control::{
    busy_keys, not_paused, queue_room, spend_tokens, table_row_through_view, within_limits,
};
use crate::sql::table::StoreParams;
use sea_query::{
    CommonTableExpression, Expr, ExprTrait, LockBehavior, LockType, NullOrdering, Order, Query,
    SelectStatement, WithClause,
};
use workerutil::JobState;

/// A named common table expression; `materialized` ones run exactly once.
pub(super) fn cte(
    query: impl Into<sea_query::SubQueryStatement>,
    name: &str,
    materialized: bool,
) -> CommonTableExpression {
    let mut cte = CommonTableExpression::new();
    cte.query(query).table_name(alias(name));
    if materialized {
        cte.materialized(true);
    }
    cte
}

/// `FOR UPDATE OF alias SKIP LOCKED`: lock only the job table's rows, skipping
/// rows another claim or a live handler holds.
pub(super) fn lock_skip(q: &mut SelectStatement, table_alias: &str) {
    q.lock_with_tables_behavior(
        LockType::Update,
        [alias(table_alias)],
        LockBehavior::SkipLocked,
    );
}

/// Splits a user `ORDER BY` text into terms with their direction.
pub(crate) fn order_terms(order_by: &str) -> Vec<(String, Order, Option<NullOrdering>)> {
    let mut terms = Vec::new();
    let (mut depth, mut quoted, mut start) = (0i32, false, 0usize);
    let bytes = order_by.as_bytes();
    let mut pieces = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'\'' | b'"' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted => depth -= 1,
            b',' if !quoted && depth == 0 => {
                pieces.push(&order_by[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&order_by[start..]);
    for piece in pieces {
        let mut words: Vec<&str> = piece.split_whitespace().collect();
        let mut nulls = None;
        let n = words.len();
        if n >= 3 && words[n - 2].eq_ignore_ascii_case("nulls") {
            nulls = if words[n - 1].eq_ignore_ascii_case("first") {
                Some(NullOrdering::First)
            } else {
                Some(NullOrdering::Last)
            };
            words.truncate(n - 2);
        }
        let mut order = Order::Asc;
        if let Some(last) = words.last() {
            if last.eq_ignore_ascii_case("desc") {
                order = Order::Desc;
                words.pop();
            } else if last.eq_ignore_ascii_case("asc") {
                words.pop();
            }
        }
        terms.push((words.join(" "), order, nulls));
    }
    terms
}

pub(super) fn order_select(q: &mut SelectStatement, order_by: &str) {
    for (expr, order, nulls) in order_terms(order_by) {
        let expr = Expr::cust(expr);
        match nulls {
            Some(n) => q.order_by_expr_with_nulls(expr, order, n),
            None => q.order_by_expr(expr, order),
        };
    }
}

/// The columns every claim returns: the row's id, its new fencing token and
/// its cancel flag, named so they cannot clash with the user's columns. Record
/// reads add the id after the configured expressions too, so rows map back to
/// their claims; index-based scans never reach it and `FromRow` ignores it.
pub(crate) const RECORD_ID: &str = "dbworker_record_id";
/// See [`RECORD_ID`].
pub(crate) const CLAIMED_TOKEN: &str = "dbworker_token";
/// See [`RECORD_ID`].
pub(crate) const CLAIMED_CANCEL: &str = "dbworker_cancel";
/// See [`RECORD_ID`]: whether a limit bound the claim (a limited claim only),
/// in which case it may have passed rows over and must not move the cursor.
pub(crate) const CLAIM_BOUND: &str = "dbworker_limit_bound";
/// See [`RECORD_ID`]: a table with traces returns the enqueue's context
/// (parent and state), the span the previous attempt ran under (follows)
/// and whether this attempt is the first and prompt (fresh, see `trace.rs`).
pub(crate) const CLAIMED_TRACE_PARENT: &str = "dbworker_trace_parent";
/// See [`CLAIMED_TRACE_PARENT`].
pub(crate) const CLAIMED_TRACE_STATE: &str = "dbworker_trace_state";
/// See [`CLAIMED_TRACE_PARENT`].
pub(crate) const CLAIMED_TRACE_FOLLOWS: &str = "dbworker_trace_follows";
/// See [`CLAIMED_TRACE_PARENT`].
pub(crate) const CLAIMED_TRACE_FRESH: &str = "dbworker_trace_fresh";
/// See [`RECORD_ID`]: the claimed row's queue, for a limited claim.
pub(super) const CLAIMED_QUEUE: &str = "dbworker_limit_queue";

/// How soon after its enqueue a job's first attempt must start to be a
/// child of the enqueue's span rather than a root linked to it.
pub(crate) const TRACE_CHILD_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// What a claim on a table with traces returns about each job's trace (see
/// [`CLAIMED_TRACE_PARENT`]): first and prompt means no attempt before it (no
/// failure, reset or earlier span) and enqueued within
/// [`TRACE_CHILD_WITHIN`], by the database clock.
fn trace_returning(o: &StoreParams) -> Vec<Expr> {
    if !o.traces {
        return Vec::new();
    }
    let (a, c) = (&o.table.alias, &o.columns);
    let q = |name: &str| format!("{}.{}", quote(a), quote(name));
    let named = |expr: String, name: &str| Expr::cust(format!("{expr} AS {}", quote(name)));
    let within = TRACE_CHILD_WITHIN.as_secs();
    vec![
        named(q(TRACEPARENT), CLAIMED_TRACE_PARENT),
        named(q(TRACESTATE), CLAIMED_TRACE_STATE),
        named(q(TRACE_FOLLOWS), CLAIMED_TRACE_FOLLOWS),
        named(
            format!(
                "({} IS NULL AND COALESCE({}, 0) = 0 AND COALESCE({}, 0) = 0 AND {} >= now() - interval '{within} seconds')",
                q(TRACE_FOLLOWS),
                q(&c.num_failures),
                q(&c.num_resets),
                q(&c.queued_at),
            ),
            CLAIMED_TRACE_FRESH,
        ),
    ]
}

/// `(a.flags IS NULL OR NOT (a.flags && $1::text[]))` over the view's (or
/// table's) alias: the claim skips rows carrying a forbidden flag. Added as
/// one of the claim's conditions, so each set of forbidden flags has a claim
/// cursor of its own (see `store/cursor.rs`).
pub(crate) fn not_flagged(o: &StoreParams, flags_column: &str, forbidden: &[String]) -> Expr {
    let column = format!("{}.{}", quote(&o.source().alias), quote(flags_column));
    Expr::cust_with_values(
        format!("({column} IS NULL OR NOT ({column} && $1::text[]))"),
        [sea_query::Value::from(forbidden.to_vec())],
    )
}

/// Phase 1 of the dequeue: claims up to `limit` eligible rows in one statement,
/// outside any transaction, and returns `(id, token)` in priority order.
///
/// Without a view, eligible rows of the table are locked with `FOR UPDATE OF
/// alias SKIP LOCKED` in order. With a view, a window of candidates is ranked
/// through the view (where conditions and order may use its columns), then the
/// table's rows are locked and re-checked, so a complex view can never make two
/// workers claim one row (Sourcegraph PR 37067).
///
/// With `with_record` (only without a view), the claim also returns the
/// configured column expressions, evaluated on the claimed row version, ahead
/// of its own columns: the whole dequeue is then this one statement.
#[cfg(test)]
pub(crate) fn claim(
    o: &StoreParams,
    hostname: &str,
    conditions: &[Expr],
    limit: usize,
    with_record: bool,
) -> Statement {
    claim_limited(
        o,
        hostname,
        conditions,
        limit,
        with_record,
        LimitedClaim::Serialized,
    )
}

/// Orders the claimed rows by the order-by values the claim returns, so they
/// are sorted without reading the table a second time.
fn order_claimed(final_select: &mut SelectStatement, order_by: &str) {
    for (i, (_, order, nulls)) in order_terms(order_by).into_iter().enumerate() {
        let key = Expr::col((alias("dbworker_claimed"), alias(&sort_key(i))));
        match nulls {
            Some(n) => final_select.order_by_expr_with_nulls(key, order, n),
            None => final_select.order_by_expr(key, order),
        };
    }
}

/// How a claim of a limited table counts what other claims took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitedClaim {
    /// After every claim lane's lock: it sees every earlier claim, and ranks
    /// rows within each queue's exact room.
    Serialized,
    /// In one claim lane, beside claims in the other lanes it cannot see: it
    /// takes rows only when every limited queue has room for `threshold` more
    /// (what all lanes together may take at once), and nothing otherwise.
    Lane { threshold: u64 },
}

/// [`claim`] with the way a limited claim counts other claims.
pub(crate) fn claim_limited(
    o: &StoreParams,
    hostname: &str,
    conditions: &[Expr],
    limit: usize,
    with_record: bool,
    mode: LimitedClaim,
) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let limit = limit as u64;
    let with_record = with_record && o.view.is_none();
    let mut with = WithClause::new();
    let candidates = alias("dbworker_candidates");
    let mut final_select = Query::select();
    final_select
        .column((alias("dbworker_claimed"), sea_query::Asterisk))
        .from(alias("dbworker_claimed"));

    match &o.view {
        None if o.aging.is_some() && o.priority_column.is_some() => {
            let (Some(aging), Some(priority)) = (&o.aging, &o.priority_column) else {
                unreachable!("matched above")
            };
            let cand = aging_candidates(o, aging, priority, conditions, limit, &mut with);
            with.cte(cte(cand, "dbworker_candidates", true));
            final_select
                .inner_join(
                    candidates.clone(),
                    col("dbworker_candidates", "id").equals(("dbworker_claimed", RECORD_ID)),
                )
                .order_by(("dbworker_candidates", "eff"), Order::Desc)
                .order_by(("dbworker_candidates", "boost"), Order::Desc);
            order_claimed(&mut final_select, &o.order_by);
        }
        None => {
            let mut cand = Query::select();
            cand.expr_as(col(&t.alias, &c.id), alias("id"))
                .from(table_ref(t))
                .cond_where(eligible(&t.alias, c));
            match (&o.limit_table, &o.queue_column) {
                (Some(limits), Some(queue)) => {
                    with.cte(cte(queue_room(o, limits, queue), "dbworker_room", true));
                    if let Some(key) = &o.limit_key_column {
                        with.cte(cte(busy_keys(o, queue, key), "dbworker_busy_keys", true));
                    }
                    for cond in conditions {
                        cand.and_where(cond.clone());
                    }
                    if let Some(e) = not_paused(o, &t.alias) {
                        cand.and_where(e);
                    }
                    match mode {
                        // A limit binds this claim only if some queue has less
                        // room than the claim may take, or is limited per key;
                        // otherwise rows are taken in order as in a plain
                        // claim (the test runs once, and OR skips the ranking).
                        LimitedClaim::Serialized => {
                            cand.and_where(limit_binds(limit).not().or(
                                col(&t.alias, &c.id).in_subquery(within_limits(
                                    o,
                                    conditions,
                                    queue,
                                    limit + o.candidate_window as u64,
                                )),
                            ));
                            final_select.expr_as(limit_binds(limit), alias(CLAIM_BOUND));
                        }
                        LimitedClaim::Lane { threshold } => {
                            cand.and_where(limit_binds(threshold).not());
                            final_select.expr_as(Expr::val(false), alias(CLAIM_BOUND));
                        }
                    }
                }
                _ => {
                    for cond in conditions {
                        cand.and_where(cond.clone());
                    }
                    if let Some(e) = not_paused(o, &t.alias) {
                        cand.and_where(e);
                    }
                }
            }
            order_select(&mut cand, &o.order_by);
            cand.limit(limit);
            lock_skip(&mut cand, &t.alias);
            with.cte(cte(cand, "dbworker_candidates", true));
            order_claimed(&mut final_select, &o.order_by);
        }
        Some(v) => {
            let mut window = Query::select();
            window
                .expr_as(col(&v.alias, &c.id), alias("id"))
                .expr_as(
                    Expr::cust(format!("row_number() OVER (ORDER BY {})", o.order_by)),
                    alias("rank"),
                )
                .from(table_ref(v))
                // The view need not show the layout's column; the join below
                // tests the table's own rows with it.
                .cond_where(eligible(&v.alias, &c.without_live()));
            for cond in conditions {
                window.and_where(cond.clone());
            }
            // A paused queue's rows leave the window too: filling it, they
            // would starve every other queue for as long as the pause lasts.
            if let Some(e) = table_row_through_view(o, v, None) {
                window.and_where(e);
            }
            order_select(&mut window, &o.order_by);
            window.limit(limit + o.candidate_window as u64);
            with.cte(cte(window, "dbworker_window", true));
            let mut cand = Query::select();
            cand.expr_as(col(&t.alias, &c.id), alias("id"))
                .expr_as(col("dbworker_window", "rank"), alias("rank"))
                .from(table_ref(t))
                .inner_join(
                    alias("dbworker_window"),
                    col("dbworker_window", "id").equals((alias(&t.alias), alias(&c.id))),
                )
                .cond_where(eligible(&t.alias, c))
                .order_by(("dbworker_window", "rank"), Order::Asc)
                .limit(limit);
            if let Some(e) = not_paused(o, &t.alias) {
                cand.and_where(e);
            }
            lock_skip(&mut cand, &t.alias);
            with.cte(cte(cand, "dbworker_candidates", true));
            final_select
                .inner_join(
                    candidates.clone(),
                    col("dbworker_candidates", "id").equals(("dbworker_claimed", RECORD_ID)),
                )
                .order_by(("dbworker_candidates", "rank"), Order::Asc);
        }
    }

    let a = &t.alias;
    let mut update = Query::update();
    update
        .table(table_ref(t))
        .value(alias(&c.state), state(JobState::Processing))
        .value(
            alias(&c.started_at),
            Expr::cust(format!(
                "GREATEST(now(), {}.{} + interval '1 microsecond')",
                quote(a),
                quote(&c.started_at)
            )),
        )
        .value(alias(&c.last_heartbeat_at), Expr::cust("now()"))
        .value(alias(&c.finished_at), Expr::cust("NULL"))
        .value(alias(&c.failure_message), Expr::cust("NULL"))
        .value(alias(&c.execution_logs), Expr::cust("NULL"))
        .value(alias(&c.worker_hostname), hostname);
    // A resumed job waits for nothing any more.
    if o.signals.is_some() {
        update.value(alias(crate::columns::AWAITING), Expr::cust("NULL"));
    }
    update
        // `= ANY(ARRAY(…))`, not a join: a generic plan of a prepared claim,
        // which cannot see how few candidates there are, chose a hash join
        // that read the whole table; the array always walks the primary key.
        .and_where(Expr::cust(format!(
            "{}.{} = ANY(ARRAY(SELECT \"id\" FROM \"dbworker_candidates\"))",
            quote(a),
            quote(&c.id)
        )))
        .returning(
            Query::returning().exprs(
                with_record
                    .then(|| o.column_expressions.iter().map(|e| Expr::cust(e.clone())))
                    .into_iter()
                    .flatten()
                    .chain([
                        Expr::cust(format!(
                            "{}.{}::bigint AS {}",
                            quote(a),
                            quote(&c.id),
                            quote(RECORD_ID)
                        )),
                        Expr::cust(format!(
                            "(EXTRACT(EPOCH FROM {}.{}) * 1000000)::bigint AS {}",
                            quote(a),
                            quote(&c.started_at),
                            quote(CLAIMED_TOKEN)
                        )),
                        Expr::cust(format!(
                            "{}.{} AS {}",
                            quote(a),
                            quote(&c.cancel),
                            quote(CLAIMED_CANCEL)
                        )),
                    ])
                    .chain(
                        o.view
                            .is_none()
                            .then(|| order_terms(&o.order_by))
                            .into_iter()
                            .flatten()
                            .enumerate()
                            .map(|(i, (expr, _, _))| {
                                Expr::cust(format!("{expr} AS {}", quote(&sort_key(i))))
                            }),
                    )
                    .chain(trace_returning(o))
                    .chain(progress_returning(o))
                    .chain(limited(o).and(o.queue_column.as_ref()).map(|queue| {
                        Expr::cust(format!(
                            "{}.{}::text AS {}",
                            quote(a),
                            quote(queue),
                            quote(CLAIMED_QUEUE)
                        ))
                    })),
            ),
        );
    with.cte(cte(update, "dbworker_claimed", false));
    if let Some(limits) = limited(o) {
        with.cte(cte(spend_tokens(o, limits), "dbworker_spent", false));
    }
    Statement::from(&final_select.with(with))
}

/// The limit table, when the claim enforces limits (a table, not a view,
/// with a queue column).
pub(crate) fn limited(o: &StoreParams) -> Option<&Relation> {
    match (&o.limit_table, &o.queue_column, &o.view) {
        (Some(limits), Some(_), None) => Some(limits),
        _ => None,
    }
}

/// Whether a limit binds the claim: some queue has less room than the claim
/// may take, or is limited per key (then rows may be passed over).
fn limit_binds(limit: u64) -> Expr {
    Expr::cust_with_values(
        "EXISTS (SELECT 1 FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"room\" < $1 OR \"r\".\"max_per_key\" IS NOT NULL)",
        [limit as i64],
    )
}

/// The name of the claim's `i`-th order-by value (returned after its own
/// columns, so index-based scans never reach it).
pub(super) fn sort_key(i: usize) -> String {
    format!("dbworker_sort_{i}")
}

/// `SELECT <column expressions>, id AS dbworker_record_id FROM <view or table>`.
pub(super) fn select_columns(o: &StoreParams) -> SelectStatement {
    let s = o.source();
    let mut q = Query::select();
    for e in &o.column_expressions {
        q.expr(Expr::cust(e.clone()));
    }
    q.expr(Expr::cust(format!(
        "{}.{}::bigint AS {}",
        quote(&s.alias),
        quote(&o.columns.id),
        quote(RECORD_ID)
    )))
    .from(table_ref(s));
    q
}

/// Phase 2, heartbeat handling: reads every claimed record in one statement.
pub(crate) fn select_records(o: &StoreParams, ids: Vec<i64>) -> Statement {
    let s = o.source();
    let mut q = select_columns(o);
    q.and_where(Expr::cust_with_values(
        format!(
            "{}.{} = ANY($1::bigint[])",
            quote(&s.alias),
            quote(&o.columns.id)
        ),
        [sea_query::Value::from(ids)],
    ));
    Statement::from(&q)
}

/// Phase 2, transactional handling: in the handler's transaction, locks the
/// claimed row with `FOR KEY SHARE`, which blocks neither heartbeats nor the
/// cancel flag, but makes the resetter's `FOR UPDATE SKIP LOCKED` skip it. The
/// record was read by the claim. No row: the claim was reset in between.
/// `pid` and `xact_us` (the transaction's start, microseconds): its backend,
/// learned in the same round trip, so a handler dropped mid-query can have
/// that session ended, and no other (`store/open.rs`).
pub(crate) fn lock_claimed(o: &StoreParams, id: i64, token: i64) -> Statement {
    let t = &o.table;
    let q = Query::select()
        .expr_as(col(&t.alias, &o.columns.id), alias("id"))
        .expr_as(Expr::cust("pg_backend_pid()"), alias("pid"))
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM now()) * 1000000)::bigint"),
            alias("xact_us"),
        )
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .lock_with_tables(LockType::KeyShare, [alias(&t.alias)])
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::cursor::claim_cursor_condition;
    use super::fixtures::{aging, limited, on_hot_layout, paused, quoted, resolved, with_traces};
    let (t, v, limited) = (resolved(false), resolved(true), limited());
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    let lane = LimitedClaim::Lane { threshold: 1024 };
    let gpu = ["gpu".to_owned()];
    let hot = on_hot_layout(resolved(false));
    let hot_view = on_hot_layout(resolved(true));
    let hot_limits = on_hot_layout(limited.clone());
    let mut paused_view = resolved(true);
    paused_view.pause_table = paused().pause_table.clone();
    let mut progress = resolved(false);
    progress.progress = true;
    let mut side = resolved(false);
    side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
    vec![
        (
            "claim_with_progress",
            claim(&progress, "host", &[], 3, true),
        ),
        (
            "claim_with_progress_table",
            claim(&side, "host", &[], 3, true),
        ),
        ("claim", claim(&t, "host", &[cost()], 3, false)),
        ("claim_with_record", claim(&t, "host", &[cost()], 3, true)),
        (
            "claim_with_traces",
            claim(&with_traces(), "host", &[], 3, true),
        ),
        ("claim_through_view", claim(&v, "host", &[cost()], 3, true)),
        (
            "claim_after_cursor",
            claim(&t, "host", &[claim_cursor_condition(&t, 1000)], 3, true),
        ),
        (
            "claim_without_forbidden_flags",
            claim(&t, "host", &[not_flagged(&t, "flags", &gpu)], 3, true),
        ),
        ("lock_claimed", lock_claimed(&t, 1, 2)),
        ("select_records", select_records(&t, vec![1, 2])),
        (
            "select_records_through_view",
            select_records(&v, vec![1, 2]),
        ),
        (
            "claim_unless_paused",
            claim(&paused(), "host", &[], 3, true),
        ),
        ("claim_within_limits", claim(&limited, "host", &[], 3, true)),
        (
            "claim_limited_in_a_lane",
            claim_limited(&limited, "host", &[], 3, true, lane),
        ),
        ("claim_quoted", claim(&quoted(), "host", &[], 3, true)),
        (
            "claim_with_aging",
            claim(&aging(), "host", &[cost()], 3, true),
        ),
        ("claim_hot", claim(&hot, "h", &[], 3, true)),
        ("claim_hot_view", claim(&hot_view, "h", &[], 3, true)),
        ("claim_hot_limits", claim(&hot_limits, "h", &[], 3, true)),
        (
            "claim_through_view_unless_paused",
            claim(&paused_view, "h", &[], 3, true),
        ),
    ]
}
