//! Every SQL statement the store, the heartbeat and the resetter run: one
//! function per statement, built with sea-query. Identifiers are quoted and
//! values are bound; the only raw SQL is what the user configured as SQL
//! (column expressions, order-by, extra conditions) and fixed fragments below.
//!
//! The fencing token of a claim is its `started_at` in microseconds. A claim
//! sets `started_at = GREATEST(now(), started_at + 1µs)`, so every claim of a row
//! gets a new, larger token, and every later write requires the token it got.

use sea_query::{
    Alias, CommonTableExpression, Condition, Expr, ExprTrait, InsertStatement, IntoIden,
    LockBehavior, LockType, NullOrdering, OnConflict, Order, PostgresQueryBuilder, Query,
    SelectStatement, TableRef, UpdateStatement, WithClause,
};
use sea_query_sqlx::{SqlxBinder, SqlxValues};
use workerutil::{JobState, MAX_EXECUTION_LOG_ENTRIES};

use crate::columns::{Columns, Relation};
use crate::enqueue::{KeyMode, NewJob, RunAt, Target};
use crate::message::sanitize_failure_message;
use crate::options::{Resolved, RetryPolicy};

/// A rendered statement with its bound values.
#[derive(Debug)]
pub(crate) struct Statement {
    pub(crate) sql: String,
    pub(crate) values: SqlxValues,
}

impl Statement {
    fn from(q: &impl SqlxBinder) -> Statement {
        let (sql, values) = q.build_sqlx(PostgresQueryBuilder);
        Statement { sql, values }
    }

    /// The statement as an sqlx query.
    pub(crate) fn query(self) -> sqlx::query::Query<'static, sqlx::Postgres, SqlxValues> {
        sqlx::query_with(sqlx::AssertSqlSafe(self.sql), self.values)
    }
}

/// Quotes an identifier for SQL.
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn alias(name: &str) -> Alias {
    Alias::new(name)
}

fn table_ref(rel: &Relation) -> TableRef {
    let r: TableRef = match &rel.schema {
        Some(schema) => (alias(schema), alias(&rel.name)).into(),
        None => alias(&rel.name).into(),
    };
    r.alias(alias(&rel.alias))
}

fn col(rel_alias: &str, name: &str) -> Expr {
    Expr::col((alias(rel_alias), alias(name)))
}

/// A state as a literal, not a bound value: the states are our own constants,
/// and a literal lets Postgres match the partial indexes (`WHERE state IN
/// ('queued', 'errored')`) in a cached generic plan, so a prepared claim or
/// mark need not be planned again on every call.
fn state(s: JobState) -> Expr {
    Expr::cust(format!("'{}'", s.as_str()))
}

/// The fencing token of the row aliased `a`.
fn token_expr(a: &str, c: &Columns) -> Expr {
    Expr::cust(format!(
        "(EXTRACT(EPOCH FROM {}.{}) * 1000000)::bigint",
        quote(a),
        quote(&c.started_at)
    ))
}

/// `COALESCE(a.column, 0)`: counters are read NULL-safe, so a nullable counter
/// holding NULL counts as 0 instead of making every comparison unknown.
fn counter(a: &str, column: &str) -> Expr {
    Expr::cust(format!("COALESCE({}.{}, 0)", quote(a), quote(column)))
}

/// `a.state IN ('queued','errored') AND (a.process_after IS NULL OR a.process_after <= now())`.
fn eligible(a: &str, c: &Columns) -> Condition {
    Condition::all()
        .add(col(a, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]))
        .add(
            Condition::any()
                .add(col(a, &c.process_after).is_null())
                .add(col(a, &c.process_after).lte(Expr::cust("now()"))),
        )
}

/// The name a job table is paused under: `schema.name` or `name`.
pub(crate) fn pause_key(table: &Relation) -> String {
    table.display_name()
}

/// `NOT EXISTS` a pause of the table (queue `*`) or of the row's queue, when
/// the store consults a pause table.
fn not_paused(o: &Resolved, a: &str) -> Option<Expr> {
    let pauses = o.pause_table.as_ref()?;
    let queue = match &o.queue_column {
        Some(column) => format!(" OR p.\"queue\" = {}.{}", quote(a), quote(column)),
        None => String::new(),
    };
    Some(Expr::cust_with_values(
        format!(
            "NOT EXISTS (SELECT 1 FROM {} AS p WHERE p.\"job_table\" = $1 AND (p.\"queue\" = '*'{queue}))",
            pauses.quoted()
        ),
        [pause_key(&o.table)],
    ))
}

/// Each limited queue's room: the fewest of what its `max_processing` leaves
/// beside the jobs of that queue processing now (counted through the
/// processing partial index) and the whole tokens its rate bucket holds at
/// the statement's start; NULL when neither is limited. The bucket's level
/// and time come along, so the claim can spend what it took.
fn queue_room(o: &Resolved, limits: &Relation, queue: &str) -> SelectStatement {
    let c = &o.columns;
    let l = quote(&limits.alias);
    let busy = format!(
        "(SELECT count(*) FROM {} AS \"dbworker_busy\" WHERE \"dbworker_busy\".{} = 'processing' AND \"dbworker_busy\".{}::text = {l}.\"queue\")",
        o.table.quoted(),
        quote(&c.state),
        quote(queue),
    );
    let tokens = format!(
        "LEAST(COALESCE({l}.\"burst\", GREATEST(ceil({l}.\"rate_per_second\"), 1)), {l}.\"tokens\" + {l}.\"rate_per_second\" * EXTRACT(EPOCH FROM statement_timestamp() - {l}.\"refilled_at\")::float8)"
    );
    Query::select()
        .expr_as(col(&limits.alias, "queue"), alias("queue"))
        .expr_as(
            Expr::cust(format!(
                "LEAST(CASE WHEN {l}.\"max_processing\" IS NOT NULL THEN GREATEST({l}.\"max_processing\" - {busy}, 0) END, CASE WHEN {l}.\"rate_per_second\" IS NOT NULL THEN GREATEST(floor({tokens}), 0)::integer END)"
            )),
            alias("room"),
        )
        .expr_as(col(&limits.alias, "max_per_key"), alias("max_per_key"))
        .expr_as(Expr::cust(tokens), alias("tokens"))
        .expr_as(Expr::cust("statement_timestamp()"), alias("at"))
        .from(table_ref(limits))
        .and_where(col(&limits.alias, "job_table").eq(pause_key(&o.table)))
        .to_owned()
}

/// Processing jobs per queue and key, for the queues limited per key.
fn busy_keys(o: &Resolved, queue: &str, key: &str) -> SelectStatement {
    let b = "dbworker_busy";
    Query::select()
        .expr_as(Expr::cust(format!("{}.{}::text", quote(b), quote(queue))), alias("queue"))
        .expr_as(col(b, key), alias("key"))
        .expr_as(Expr::cust("count(*)"), alias("busy"))
        .from(table_ref(&Relation {
            alias: b.to_owned(),
            ..o.table.clone()
        }))
        .and_where(col(b, &o.columns.state).eq(state(JobState::Processing)))
        .and_where(col(b, key).is_not_null())
        .and_where(Expr::cust(format!(
            "{}.{}::text IN (SELECT \"r\".\"queue\" FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"max_per_key\" IS NOT NULL)",
            quote(b),
            quote(queue)
        )))
        .add_group_by([Expr::cust("1"), Expr::cust("2")])
        .to_owned()
}

/// What the per-key limit leaves for the row's key (NULL: not limited).
fn key_room(a: &str, queue: &str, key: &str) -> String {
    let (a, queue, key) = (quote(a), quote(queue), quote(key));
    format!(
        "CASE WHEN {a}.{key} IS NULL THEN NULL ELSE (SELECT \"r\".\"max_per_key\" - COALESCE((SELECT \"k\".\"busy\" FROM \"dbworker_busy_keys\" AS \"k\" WHERE \"k\".\"queue\" = {a}.{queue}::text AND \"k\".\"key\" = {a}.{key}), 0) FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"queue\" = {a}.{queue}::text) END"
    )
}

/// Ids of eligible rows, in priority order, of which each limited queue
/// contributes at most its room, and each key at most its own room (queues
/// and keys without room are skipped whole, so they never crowd out the
/// others): `window` rows are ranked per key, then per queue.
fn within_limits(o: &Resolved, conditions: &[Expr], queue: &str, window: u64) -> SelectStatement {
    let t = &o.table;
    let c = &o.columns;
    let a = &t.alias;
    let mut eligible_rows = Query::select();
    eligible_rows
        .expr(Expr::cust(format!("{}.*", quote(a))))
        .from(table_ref(t))
        .cond_where(eligible(a, c));
    for cond in conditions {
        eligible_rows.and_where(cond.clone());
    }
    if let Some(e) = not_paused(o, a) {
        eligible_rows.and_where(e);
    }
    eligible_rows.and_where(Expr::cust(format!(
        "NOT EXISTS (SELECT 1 FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"queue\" = {}.{}::text AND \"r\".\"room\" = 0)",
        quote(a),
        quote(queue)
    )));
    if let Some(key) = &o.limit_key_column {
        eligible_rows.and_where(Expr::cust(format!(
            "COALESCE({} > 0, true)",
            key_room(a, queue, key)
        )));
    }
    order_select(&mut eligible_rows, &o.order_by);
    eligible_rows.limit(window);
    // Each subquery keeps the table's alias, so `order_by` reads the same.
    let source = match &o.limit_key_column {
        None => eligible_rows,
        Some(key) => {
            let ranked_by_key = Query::select()
                .expr(Expr::cust(format!("{}.*", quote(a))))
                .expr_as(
                    Expr::cust(format!(
                        "row_number() OVER (PARTITION BY {}.{}, {}.{} ORDER BY {})",
                        quote(a),
                        quote(queue),
                        quote(a),
                        quote(key),
                        o.order_by
                    )),
                    alias("dbworker_key_rank"),
                )
                .expr_as(
                    Expr::cust(key_room(a, queue, key)),
                    alias("dbworker_key_room"),
                )
                .from_subquery(eligible_rows, alias(a))
                .to_owned();
            Query::select()
                .expr(Expr::cust(format!("{}.*", quote(a))))
                .from_subquery(ranked_by_key, alias(a))
                .and_where(Expr::cust(format!(
                    "{a}.\"dbworker_key_room\" IS NULL OR {a}.\"dbworker_key_rank\" <= {a}.\"dbworker_key_room\"",
                    a = quote(a)
                )))
                .to_owned()
        }
    };
    let ranked = Query::select()
        .expr_as(col(a, &c.id), alias("id"))
        .expr_as(
            Expr::cust(format!(
                "row_number() OVER (PARTITION BY {}.{} ORDER BY {})",
                quote(a),
                quote(queue),
                o.order_by
            )),
            alias("rank"),
        )
        .expr_as(col("dbworker_room", "room"), alias("room"))
        .from_subquery(source, alias(a))
        .left_join(
            alias("dbworker_room"),
            Expr::cust(format!(
                "\"dbworker_room\".\"queue\" = {}.{}::text",
                quote(a),
                quote(queue)
            )),
        )
        .to_owned();
    Query::select()
        .column((alias("dbworker_ranked"), alias("id")))
        .from_subquery(ranked, alias("dbworker_ranked"))
        .and_where(Expr::cust(
            "\"dbworker_ranked\".\"room\" IS NULL OR \"dbworker_ranked\".\"rank\" <= \"dbworker_ranked\".\"room\"",
        ))
        .to_owned()
}

/// Spends the tokens of the rate-limited queues the claim took jobs from
/// (claims of a limited table are serialized, so the bucket never races).
fn spend_tokens(o: &Resolved, limits: &Relation) -> UpdateStatement {
    let l = quote(&limits.alias);
    let taken = format!(
        "(SELECT count(*) FROM \"dbworker_claimed\" AS \"c\" WHERE \"c\".{} = {l}.\"queue\")",
        quote(CLAIMED_QUEUE)
    );
    Query::update()
        .table(table_ref(limits))
        .value(alias("tokens"), Expr::cust(format!("\"dbworker_room\".\"tokens\" - {taken}")))
        .value(alias("refilled_at"), Expr::cust("\"dbworker_room\".\"at\""))
        .from(alias("dbworker_room"))
        .and_where(col(&limits.alias, "job_table").eq(pause_key(&o.table)))
        .and_where(Expr::cust(format!(
            "\"dbworker_room\".\"queue\" = {l}.\"queue\" AND {l}.\"rate_per_second\" IS NOT NULL AND {taken} > 0"
        )))
        .to_owned()
}

/// Serializes the claims of one job table (limited claims run after it, in
/// the same transaction, so each sees the ones before).
pub(crate) fn claim_lock(o: &Resolved) -> Statement {
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "pg_advisory_xact_lock(hashtextextended($1, 0))",
            [format!("dbworker_claim:{}", pause_key(&o.table))],
        ))
        .to_owned();
    Statement::from(&q)
}

/// `a.id = $id AND a.state = 'processing' AND token(a) = $token`: the lease guard.
fn owned(a: &str, c: &Columns, id: i64, token: i64) -> Condition {
    Condition::all()
        .add(col(a, &c.id).eq(id))
        .add(col(a, &c.state).eq(state(JobState::Processing)))
        .add(token_expr(a, c).eq(token))
}

/// A named common table expression; `materialized` ones run exactly once.
fn cte(
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
fn lock_skip(q: &mut SelectStatement, table_alias: &str) {
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

fn order_select(q: &mut SelectStatement, order_by: &str) {
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
/// See [`RECORD_ID`]: the claimed row's queue, for a limited claim.
const CLAIMED_QUEUE: &str = "dbworker_limit_queue";

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
pub(crate) fn claim(
    o: &Resolved,
    hostname: &str,
    conditions: &[Expr],
    limit: usize,
    with_record: bool,
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
                    cand.and_where(col(&t.alias, &c.id).in_subquery(within_limits(
                        o,
                        conditions,
                        queue,
                        limit + o.candidate_window as u64,
                    )));
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
            // The claim returns its order-by values, so the claimed rows are
            // sorted without reading the table a second time.
            for (i, (_, order, nulls)) in order_terms(&o.order_by).into_iter().enumerate() {
                let key = Expr::col((alias("dbworker_claimed"), alias(&sort_key(i))));
                match nulls {
                    Some(n) => final_select.order_by_expr_with_nulls(key, order, n),
                    None => final_select.order_by_expr(key, order),
                };
            }
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
                .cond_where(eligible(&v.alias, c));
            for cond in conditions {
                window.and_where(cond.clone());
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
        .value(alias(&c.worker_hostname), hostname)
        .from(candidates.clone())
        .and_where(col(a, &c.id).equals(("dbworker_candidates", "id")))
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
fn limited(o: &Resolved) -> Option<&Relation> {
    match (&o.limit_table, &o.queue_column, &o.view) {
        (Some(limits), Some(_), None) => Some(limits),
        _ => None,
    }
}

/// The name of the claim's `i`-th order-by value (returned after its own
/// columns, so index-based scans never reach it).
fn sort_key(i: usize) -> String {
    format!("dbworker_sort_{i}")
}

/// `SELECT <column expressions>, id AS dbworker_record_id FROM <view or table>`.
fn select_columns(o: &Resolved) -> SelectStatement {
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
pub(crate) fn select_records(o: &Resolved, ids: Vec<i64>) -> Statement {
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
pub(crate) fn lock_claimed(o: &Resolved, id: i64, token: i64) -> Statement {
    let t = &o.table;
    let q = Query::select()
        .expr_as(col(&t.alias, &o.columns.id), alias("id"))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .lock_with_tables(LockType::KeyShare, [alias(&t.alias)])
        .to_owned();
    Statement::from(&q)
}

/// Heartbeat: returns `(id, cancel)` for every lease still owned, and touches
/// `last_heartbeat_at` on those rows. The handler's `FOR KEY SHARE` lock does
/// not block this update; a row the handler itself updated (a stronger lock) is
/// skipped rather than waited on, and its lock shows it is alive.
pub(crate) fn heartbeat(o: &Resolved, ids: Vec<i64>, tokens: Vec<i64>) -> Statement {
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
    let touch = Query::update()
        .table(table_ref(t))
        .value(alias(&c.last_heartbeat_at), Expr::cust("now()"))
        .and_where(col(a, &c.id).in_subquery(lockable))
        .to_owned();
    let mut with = WithClause::new();
    with.cte(cte(owned_q, "dbworker_owned", true))
        .cte(cte(touch, "dbworker_touched", false));
    let q = Query::select()
        .expr(Expr::cust("\"dbworker_owned\".\"id\"::bigint AS \"id\""))
        .expr(Expr::cust("\"dbworker_owned\".\"cancel\" AS \"cancel\""))
        .from(alias("dbworker_owned"))
        .to_owned();
    Statement::from(&q.with(with))
}

fn fenced_update(o: &Resolved, id: i64, token: i64) -> UpdateStatement {
    let t = &o.table;
    Query::update()
        .table(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned()
}

/// Marks a claimed job completed. Runs inside the handler's transaction in
/// transactional handling, where `now()` is the transaction's start: times use
/// `clock_timestamp()`.
pub(crate) fn mark_complete(o: &Resolved, id: i64, token: i64) -> Statement {
    let c = &o.columns;
    let q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    Statement::from(&q)
}

/// The job's retry limit: its own column's value when the table has one and it
/// is set, else the store's `max_num_retries`.
fn max_retries(o: &Resolved, a: &str) -> Expr {
    match &o.max_retries_column {
        Some(column) => Expr::cust_with_values(
            format!("COALESCE({}.{}, $1)", quote(a), quote(column)),
            [i64::from(o.max_num_retries)],
        ),
        None => Expr::val(o.max_num_retries),
    }
}

/// The delay before the next retry, in SQL over the row's `num_failures` (the
/// value before this failure is counted).
fn retry_delay(a: &str, c: &Columns, r: &RetryPolicy) -> Expr {
    Expr::cust_with_values(
        format!(
            "make_interval(secs => LEAST($1::float8, $2::float8 * power($3::float8, COALESCE({}.{}, 0))) * (1 + $4::float8 * (2 * random() - 1)))",
            quote(a),
            quote(&c.num_failures)
        ),
        [
            r.max_delay.as_secs_f64(),
            r.retry_after.as_secs_f64(),
            r.backoff_factor,
            r.jitter,
        ],
    )
}

/// Records a retryable failure: `canceled` if cancellation was requested,
/// `failed` once retries are exhausted, else `errored` with `process_after`
/// set to the next retry time.
pub(crate) fn mark_errored(o: &Resolved, id: i64, token: i64, message: &str) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let exhausted = || counter(a, &c.num_failures).add(1).gt(max_retries(o, a));
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(col(a, &c.cancel), state(JobState::Canceled))
                .case(exhausted(), state(JobState::Failed))
                .finally(state(JobState::Errored)),
        )
        .value(
            alias(&c.process_after),
            Expr::case(
                Condition::any().add(col(a, &c.cancel)).add(exhausted()),
                col(a, &c.process_after),
            )
            .finally(Expr::cust("now()").add(retry_delay(a, c, &o.retry))),
        )
        .value(alias(&c.num_failures), counter(a, &c.num_failures).add(1))
        .value(
            alias(&c.failure_message),
            sanitize_failure_message(message).as_ref(),
        )
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    Statement::from(&q)
}

/// What a batched mark does to one job: what [`mark_complete`],
/// [`mark_errored`] or [`mark_failed`] would do to it alone.
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

/// One job of a batched mark.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) id: i64,
    pub(crate) token: i64,
    pub(crate) kind: MarkKind,
    pub(crate) message: String,
}

/// Completes many claimed jobs in one statement (heartbeat handling, a batch
/// of completions only: the common case, planned once and cached). Returns the
/// ids that were marked; any other was no longer ours.
pub(crate) fn complete_batch(o: &Resolved, ids: Vec<i64>, tokens: Vec<i64>) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .from(TableRef::SubQuery(
            Box::new(
                Query::select()
                    .expr_as(
                        Expr::cust_with_values("unnest($1::bigint[])", [ids]),
                        alias("id"),
                    )
                    .expr_as(
                        Expr::cust_with_values("unnest($1::bigint[])", [tokens]),
                        alias("token"),
                    )
                    .to_owned(),
            ),
            alias("dbworker_marks").into_iden(),
        ))
        .and_where(col(a, &c.id).equals(("dbworker_marks", "id")))
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
        .and_where(token_expr(a, c).equals(("dbworker_marks", "token")))
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(a),
            quote(&c.id)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// Marks many claimed jobs in one statement (heartbeat handling): each gets
/// what its own mark would do, and only while its lease still owns the row.
/// Returns the ids that were marked; any other was no longer ours.
pub(crate) fn mark_batch(o: &Resolved, marks: &[Mark]) -> Statement {
    let c = &o.columns;
    let t = &o.table;
    let a = &t.alias;
    let q = |name: &str| format!("{}.{}", quote(a), quote(name));
    let failures = format!("COALESCE({}, 0)", q(&c.num_failures)); // see counter()
    let cancel = format!("COALESCE({}, false)", q(&c.cancel));
    let marks_q = Query::select()
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
    let exhausted = Expr::cust(format!("{failures} + 1")).gt(max_retries(o, a));
    let retry_now = Condition::all()
        .add(Expr::cust(kind_is(MarkKind::Errored)))
        .add(Expr::cust(format!("NOT {cancel}")))
        .add(exhausted.clone().not());
    let update = Query::update()
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
                Expr::cust("now()").add(retry_delay(a, c, &o.retry)),
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
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
        .and_where(token_expr(a, c).equals(("dbworker_marks", "token")))
        .returning(Query::returning().expr(Expr::cust(format!("{}::bigint AS \"id\"", q(&c.id)))))
        .to_owned();
    let with = WithClause::new()
        .cte(cte(marks_q, "dbworker_marks", true))
        .to_owned();
    Statement::from(&update.with(with))
}

/// Records a final failure: `canceled` if cancellation was requested, else `failed`.
pub(crate) fn mark_failed(o: &Resolved, id: i64, token: i64, message: &str) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(col(a, &c.cancel), state(JobState::Canceled))
                .finally(state(JobState::Failed)),
        )
        .value(alias(&c.num_failures), counter(a, &c.num_failures).add(1))
        .value(
            alias(&c.failure_message),
            sanitize_failure_message(message).as_ref(),
        )
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    Statement::from(&q)
}

/// Puts a claimed job back in the queue without counting a failure.
pub(crate) fn requeue(o: &Resolved, id: i64, token: i64) -> Statement {
    let c = &o.columns;
    let q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Queued))
        .value(alias(&c.worker_hostname), "")
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .value(alias(&c.process_after), Expr::cust("NULL"))
        .to_owned();
    Statement::from(&q)
}

/// Puts back a claimed job whose transaction connection was lost (a Postgres
/// restart, a terminated backend): not the handler's fault, so `num_failures` is
/// untouched. It counts as a reset, as if the resetter had found it: `queued`
/// with `num_resets + 1`, or `failed` with `message` once it was reset
/// `max_num_resets` times, so a job that keeps killing its connection still ends.
pub(crate) fn requeue_lost(o: &Resolved, id: i64, token: i64, message: &str) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let resets = || counter(a, &c.num_resets);
    let can_requeue = || resets().lt(o.max_num_resets);
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(can_requeue(), state(JobState::Queued)).finally(state(JobState::Failed)),
        )
        .value(
            alias(&c.num_resets),
            Expr::case(can_requeue(), resets().add(1)).finally(resets()),
        )
        .value(
            alias(&c.failure_message),
            Expr::case(can_requeue(), col(a, &c.failure_message))
                .finally(sanitize_failure_message(message).as_ref()),
        )
        .value(
            alias(&c.finished_at),
            Expr::case(can_requeue(), Expr::cust("NULL")).finally(Expr::cust("now()")),
        )
        .value(
            alias(&c.process_after),
            Expr::case(can_requeue(), Expr::cust("NULL")).finally(col(a, &c.process_after)),
        )
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .value(alias(&c.worker_hostname), "")
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::text AS \"state\"",
            quote(a),
            quote(&c.state)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// Appends an execution log entry (filling in `start_time` from the database
/// clock when absent) and returns the new length of the log. A log that holds
/// `MAX_EXECUTION_LOG_ENTRIES` already matches no row, as a lost lease does;
/// [`log_len`] tells the two apart.
pub(crate) fn log_append(o: &Resolved, id: i64, token: i64, entry_json: String) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let logs = format!("{}.{}", quote(a), quote(&c.execution_logs));
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.execution_logs),
            Expr::cust_with_values(
                format!(
                    "COALESCE({logs}, '{{}}'::json[]) || (jsonb_build_object('start_time', now()) || $1::jsonb)::json"
                ),
                [entry_json],
            ),
        )
        .and_where(Expr::cust_with_values(
            format!("COALESCE(array_length({logs}, 1), 0) < $1"),
            [i64::try_from(MAX_EXECUTION_LOG_ENTRIES).unwrap_or(i64::MAX)],
        ))
        .returning(Query::returning().expr(Expr::cust(format!(
            "COALESCE(array_length({}, 1), 0)::bigint AS \"len\"",
            quote(&c.execution_logs)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// The length of a claimed job's execution log, if the lease still owns it.
pub(crate) fn log_len(o: &Resolved, id: i64, token: i64) -> Statement {
    let t = &o.table;
    let q = Query::select()
        .expr(Expr::cust(format!(
            "COALESCE(array_length({}.{}, 1), 0)::bigint AS \"len\"",
            quote(&t.alias),
            quote(&o.columns.execution_logs)
        )))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned();
    Statement::from(&q)
}

/// Replaces the log entry at 0-based `index`, keeping its `start_time` unless
/// the new entry sets one.
pub(crate) fn log_update(
    o: &Resolved,
    id: i64,
    token: i64,
    index: usize,
    entry_json: String,
) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let logs = format!("{}.{}", quote(a), quote(&c.execution_logs));
    let pos = i64::try_from(index).unwrap_or(i64::MAX - 1) + 1;
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.execution_logs),
            Expr::cust_with_values(
                format!(
                    "ARRAY(SELECT CASE WHEN u.o = $1 THEN (jsonb_build_object('start_time', u.e -> 'start_time') || $2::jsonb)::json ELSE u.e END FROM unnest({logs}) WITH ORDINALITY AS u(e, o) ORDER BY u.o)"
                ),
                [sea_query::Value::from(pos), sea_query::Value::from(entry_json)],
            ),
        )
        .and_where(Expr::cust_with_values(
            format!("COALESCE(array_length({logs}, 1), 0) >= $1"),
            [pos],
        ))
        .to_owned();
    Statement::from(&q)
}

/// The resetter's pass, in one atomic statement: processing rows whose
/// heartbeat is older than the stalled max age and that no live transaction
/// locks go back to `queued` (num_resets + 1), or to `failed` once they were
/// reset `max_num_resets` times. Returns `(id, new state, heartbeat age in s)`.
pub(crate) fn reset_stalled(
    t: &Relation,
    c: &Columns,
    stalled_max_age_secs: f64,
    dead_nodes: Option<&(Relation, std::time::Duration)>,
    max_num_resets: u32,
    message: &str,
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
        // to age (the fencing token still guards against a stale writer).
        stalled_or_orphaned = stalled_or_orphaned.add(Expr::cust_with_values(
            format!(
                "{}.{} IN (SELECT \"n\".\"id\" FROM {} AS \"n\" WHERE \"n\".\"heartbeat_at\" < now() - make_interval(secs => $1::float8))",
                quote(a),
                quote(&c.worker_hostname),
                nodes.quoted()
            ),
            [dead_after.as_secs_f64()],
        ));
    }
    let stalled = Query::select()
        .expr_as(col(a, &c.id), alias("id"))
        .from(table_ref(t))
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
        .cond_where(stalled_or_orphaned)
        .lock_with_tables_behavior(LockType::Update, [alias(a)], LockBehavior::SkipLocked)
        .to_owned();
    let can_requeue = || counter(a, &c.num_resets).lt(max_num_resets);
    let update = Query::update()
        .table(table_ref(t))
        .value(
            alias(&c.state),
            Expr::case(can_requeue(), state(JobState::Queued)).finally(state(JobState::Failed)),
        )
        .value(
            alias(&c.num_resets),
            Expr::case(can_requeue(), counter(a, &c.num_resets).add(1))
                .finally(col(a, &c.num_resets)),
        )
        .value(
            alias(&c.failure_message),
            Expr::case(can_requeue(), col(a, &c.failure_message))
                .finally(sanitize_failure_message(message).as_ref()),
        )
        .value(
            alias(&c.finished_at),
            Expr::case(can_requeue(), Expr::cust("NULL")).finally(Expr::cust("now()")),
        )
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

/// How many jobs wait (queued, or errored awaiting a retry). Served by the
/// partial index on those states, not a scan of the whole table.
pub(crate) fn queued_count(o: &Resolved) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let q = Query::select()
        .expr(Expr::cust("count(*)::bigint"))
        .from(table_ref(t))
        .and_where(
            col(&t.alias, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]),
        )
        .to_owned();
    Statement::from(&q)
}

/// Whether any job waits: stops at the first row.
pub(crate) fn any_queued(o: &Resolved) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let inner = Query::select()
        .expr(Expr::val(1))
        .from(table_ref(t))
        .and_where(
            col(&t.alias, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]),
        )
        .limit(1)
        .to_owned();
    let q = Query::select().expr(Expr::exists(inner)).to_owned();
    Statement::from(&q)
}

/// Seconds the oldest waiting job has been queued (0 when none), by the database clock.
pub(crate) fn max_age_in_queue(o: &Resolved) -> Statement {
    let t = &o.table;
    let c = &o.columns;
    let q = Query::select()
        .expr(Expr::cust(format!(
            "COALESCE(EXTRACT(EPOCH FROM now() - min({}.{})), 0)::float8",
            quote(&t.alias),
            quote(&c.queued_at)
        )))
        .from(table_ref(t))
        .and_where(
            col(&t.alias, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]),
        )
        .to_owned();
    Statement::from(&q)
}

/// Live rows per state (and queue): `(state, queue, count, oldest)` with the
/// oldest `queued_at` age in seconds. Two branches, each matching one partial
/// index (waiting, processing), so the cost follows the live rows, never the
/// finished ones.
pub(crate) fn queue_stats(o: &Resolved) -> Statement {
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
             COALESCE(EXTRACT(EPOCH FROM now() - min({a}.{queued_at})), 0)::float8 AS \"oldest\" \
             FROM {table} AS {a} WHERE {a}.{state} IN ({states}) GROUP BY 1, 2",
            state = quote(&c.state),
            queued_at = quote(&c.queued_at),
            table = t.quoted(),
        )
    };
    Statement {
        sql: format!(
            "{} UNION ALL {} ORDER BY 1, 2",
            branch("'queued', 'errored'"),
            branch("'processing'")
        ),
        values: SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// The relation's name as `to_regclass` takes it: quoted, and schema-qualified
/// only when configured so, so an unqualified name resolves through
/// `search_path` exactly as the other statements' names do.
fn regclass(rel: &Relation) -> Expr {
    Expr::cust_with_values("to_regclass($1::text)", [rel.quoted()])
}

/// The job table as an insert target, aliased so `ON CONFLICT … DO UPDATE`
/// can name the existing row.
const ENQUEUE_ALIAS: &str = "dbworker_job";

fn enqueue_target(t: &Target) -> TableRef {
    let r: TableRef = match &t.table.schema {
        Some(schema) => (alias(schema), alias(&t.table.name)).into(),
        None => alias(&t.table.name).into(),
    };
    r.alias(alias(ENQUEUE_ALIAS))
}

/// `process_after` for a run-at: an instant as given, or a delay from the
/// database clock's `now()`.
fn run_at_expr(run_at: RunAt) -> Expr {
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
fn enqueue_columns(t: &Target, job: &NewJob, key: Option<&str>) -> Vec<(String, Expr)> {
    let mut row: Vec<(String, Expr)> = job
        .values()
        .iter()
        .map(|(c, v)| (c.clone(), Expr::val(v.clone())))
        .collect();
    if let Some(run_at) = job.run_at_value() {
        row.push((t.columns.process_after.clone(), run_at_expr(run_at)));
    }
    if let (Some(column), Some(p)) = (&t.priority, job.priority_value()) {
        row.push((column.clone(), Expr::val(p)));
    }
    if let (Some(column), Some(q)) = (&t.queue, job.queue_value()) {
        row.push((column.clone(), Expr::val(q)));
    }
    if let (Some(column), Some(m)) = (&t.max_retries, job.max_retries_value()) {
        row.push((column.clone(), Expr::val(i64::from(m))));
    }
    if let (Some(column), Some(k)) = (&t.kind, job.kind_value()) {
        row.push((column.clone(), Expr::val(k)));
    }
    if let (Some(column), Some(k)) = (&t.key, key) {
        row.push((column.clone(), Expr::val(k)));
    }
    row
}

/// `RETURNING id::bigint AS id, (xmax = 0) AS inserted`: an updated row has the
/// updating transaction in `xmax`, a new one has none.
fn enqueue_returning(t: &Target, q: &mut InsertStatement) {
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
pub(crate) fn enqueue_rows(t: &Target, jobs: &[&NewJob]) -> Statement {
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
    enqueue_returning(t, &mut q);
    Statement::from(&q)
}

/// The states in which a job holds its key (the unique index's predicate).
fn key_live_states(state_column: &str) -> String {
    format!(
        "{} IN ('queued', 'errored', 'processing')",
        quote(state_column)
    )
}

/// Inserts a keyed job, unless a live job holds the key: then a waiting one
/// takes the new values (`Replace`, `PreserveRunAt`), and a processing one or
/// any with `DedupeOnly` is left alone (no row returned).
pub(crate) fn enqueue_keyed(t: &Target, job: &NewJob, key: &str, mode: KeyMode) -> Statement {
    let row = enqueue_columns(t, job, Some(key));
    let key_column = t.key.clone().unwrap_or_default();
    let mut q = Query::insert();
    q.into_table(enqueue_target(t))
        .columns(row.iter().map(|(c, _)| alias(c)))
        .values_panic(row.iter().map(|(_, e)| e.clone()));
    let mut conflict = OnConflict::column(alias(&key_column));
    conflict.target_and_where(Expr::cust(key_live_states(&t.columns.state)));
    let mut updated: Vec<String> = job.values().iter().map(|(c, _)| c.clone()).collect();
    if mode == KeyMode::Replace {
        updated.push(t.columns.process_after.clone());
    }
    if job.priority_value().is_some() {
        updated.extend(t.priority.clone());
    }
    if job.queue_value().is_some() {
        updated.extend(t.queue.clone());
    }
    if job.max_retries_value().is_some() {
        updated.extend(t.max_retries.clone());
    }
    if job.kind_value().is_some() {
        updated.extend(t.kind.clone());
    }
    match mode {
        KeyMode::DedupeOnly => {
            conflict.do_nothing();
        }
        KeyMode::Replace | KeyMode::PreserveRunAt => {
            if updated.is_empty() {
                // Still "updated": a no-op assignment returns the row.
                updated.push(key_column);
            }
            conflict
                .update_columns(updated.iter().map(|c| alias(c)))
                .action_and_where(Expr::cust(format!(
                    "{}.{} IN ('queued', 'errored')",
                    quote(ENQUEUE_ALIAS),
                    quote(&t.columns.state)
                )));
        }
    }
    q.on_conflict(conflict);
    enqueue_returning(t, &mut q);
    Statement::from(&q)
}

/// Deletes (or moves to the archive table) up to `batch` rows in `state`
/// finished longer than `age` ago, oldest first, skipping locked rows.
/// Returns their ids.
pub(crate) fn purge_batch(
    t: &crate::purger::Target,
    state_: JobState,
    age: std::time::Duration,
    batch: u32,
) -> Statement {
    let c = &t.columns;
    let doomed = Query::select()
        .column((alias("dbworker_doomed"), alias(&c.id)))
        .from(table_ref(&t.table).alias(alias("dbworker_doomed")))
        .and_where(col("dbworker_doomed", &c.state).eq(state(state_)))
        .and_where(Expr::cust_with_values(
            format!(
                "{}.{} < now() - make_interval(secs => $1::float8)",
                quote("dbworker_doomed"),
                quote(&c.finished_at)
            ),
            [age.as_secs_f64()],
        ))
        .order_by(
            (alias("dbworker_doomed"), alias(&c.finished_at)),
            Order::Asc,
        )
        .limit(u64::from(batch))
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .to_owned();
    let a = &t.table.alias;
    let delete = Query::delete()
        .from_table(table_ref(&t.table))
        .and_where(col(a, &c.id).in_subquery(doomed))
        .returning(Query::returning().expr(Expr::cust(match &t.archive {
            Some(_) => format!("{}.*", quote(a)),
            None => format!("{}.{}::bigint AS \"id\"", quote(a), quote(&c.id)),
        })))
        .to_owned();
    let Statement { sql, values } = Statement::from(&delete);
    match &t.archive {
        None => Statement { sql, values },
        // The archive has the table's columns in the same order (LIKE).
        Some(archive) => Statement {
            sql: format!(
                "WITH \"dbworker_moved\" AS ({sql}) INSERT INTO {} SELECT * FROM \"dbworker_moved\" RETURNING {}::bigint AS \"id\"",
                archive.quoted(),
                quote(&c.id)
            ),
            values,
        },
    }
}

/// Pauses the job table (queue `*`) or one queue; no row if it already was.
pub(crate) fn pause(pauses: &Relation, job_table: &str, queue: &str, by: &str) -> Statement {
    let mut q = Query::insert();
    q.into_table(table_ref(pauses))
        .columns([alias("job_table"), alias("queue"), alias("paused_by")])
        .values_panic([Expr::val(job_table), Expr::val(queue), Expr::val(by)])
        .on_conflict(
            OnConflict::columns([alias("job_table"), alias("queue")])
                .do_nothing()
                .to_owned(),
        )
        .returning(Query::returning().column(alias("queue")));
    Statement::from(&q)
}

/// Live jobs per state (and queue) for an operator: the queue gauges' statement.
pub(crate) fn admin_live(a: &crate::admin::Admin) -> Statement {
    live_stats(&a.table, &a.columns, a.queue_column.as_deref())
}

/// Processing jobs per worker host.
pub(crate) fn admin_hosts(a: &crate::admin::Admin) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let q = Query::select()
        .expr_as(
            Expr::cust(format!(
                "{}.{}::text",
                quote(&t.alias),
                quote(&c.worker_hostname)
            )),
            alias("host"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(col(&t.alias, &c.state).eq(state(JobState::Processing)))
        .group_by_col(alias("host"))
        .order_by(alias("host"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The planner's estimate of the table's rows.
pub(crate) fn admin_estimate(a: &crate::admin::Admin) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("GREATEST(c.reltuples, 0)::bigint"),
            alias("rows"),
        )
        .from_as((alias("pg_catalog"), alias("pg_class")), alias("c"))
        .and_where(Expr::cust("c.oid").eq(regclass(&a.table)))
        .to_owned();
    Statement::from(&q)
}

/// One job's row as JSON.
pub(crate) fn admin_show(a: &crate::admin::Admin, id: i64) -> Statement {
    let t = &a.table;
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("to_jsonb({})", quote(&t.alias))),
            alias("row"),
        )
        .from(table_ref(t))
        .and_where(col(&t.alias, &a.columns.id).eq(id))
        .to_owned();
    Statement::from(&q)
}

/// The conditions of an operator's filter on the table (aliased as usual).
fn filter_conditions(a: &crate::admin::Admin, f: &crate::JobFilter) -> Vec<Expr> {
    let (t, c) = (&a.table, &a.columns);
    let al = &t.alias;
    let mut conds = Vec::new();
    if !f.states.is_empty() {
        conds.push(col(al, &c.state).is_in(f.states.iter().map(|s| state(*s))));
    }
    for (column, value) in [(&a.queue_column, &f.queue), (&a.kind_column, &f.kind)] {
        if let (Some(column), Some(value)) = (column, value) {
            conds.push(Expr::cust_with_values(
                format!("{}.{}::text = $1", quote(al), quote(column)),
                [value.clone()],
            ));
        }
    }
    if let Some(age) = f.older_than {
        conds.push(Expr::cust_with_values(
            format!(
                "{}.{} <= now() - $1 * interval '1 second'",
                quote(al),
                quote(&c.queued_at)
            ),
            [age.as_secs_f64()],
        ));
    }
    if let Some(age) = f.newer_than {
        conds.push(Expr::cust_with_values(
            format!(
                "{}.{} >= now() - $1 * interval '1 second'",
                quote(al),
                quote(&c.queued_at)
            ),
            [age.as_secs_f64()],
        ));
    }
    if let Some(text) = &f.failure_contains {
        let escaped = text
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        conds.push(Expr::cust_with_values(
            format!("{}.{} ILIKE $1", quote(al), quote(&c.failure_message)),
            [format!("%{escaped}%")],
        ));
    }
    for field in &f.fields {
        let target = format!("{}.{}", quote(al), quote(&field.column));
        conds.push(if field.path.is_empty() {
            Expr::cust_with_values(format!("{target}::text = $1"), [field.value.clone()])
        } else {
            Expr::cust_with_values(
                format!("{target} #>> $1::text[] = $2"),
                [
                    sea_query::Value::from(field.path.clone()),
                    sea_query::Value::from(field.value.clone()),
                ],
            )
        });
    }
    conds
}

/// A page of jobs matching a filter, by id (keyset).
pub(crate) fn admin_list(
    a: &crate::admin::Admin,
    f: &crate::JobFilter,
    page: &crate::PageRequest,
) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let al = &t.alias;
    let text_or_null = |column: &Option<String>| match column {
        Some(column) => Expr::cust(format!("{}.{}::text", quote(al), quote(column))),
        None => Expr::cust("NULL::text"),
    };
    let mut q = Query::select();
    q.expr_as(
        Expr::cust(format!("{}.{}::bigint", quote(al), quote(&c.id))),
        alias("id"),
    )
    .expr_as(
        Expr::cust(format!("{}.{}::text", quote(al), quote(&c.state))),
        alias("state"),
    )
    .expr_as(text_or_null(&a.queue_column), alias("queue"))
    .expr_as(text_or_null(&a.kind_column), alias("kind"))
    .expr_as(
        Expr::cust(format!("{}.{}::integer", quote(al), quote(&c.num_failures))),
        alias("num_failures"),
    )
    .expr_as(
        Expr::cust(format!(
            "COALESCE(EXTRACT(EPOCH FROM now() - {}.{}), 0)::float8",
            quote(al),
            quote(&c.queued_at)
        )),
        alias("age"),
    )
    .expr_as(
        Expr::cust(format!(
            "COALESCE({}.{}::text, '')",
            quote(al),
            quote(&c.worker_hostname)
        )),
        alias("host"),
    )
    .expr_as(
        Expr::cust(format!("{}.{}::text", quote(al), quote(&c.failure_message))),
        alias("failure_message"),
    )
    .from(table_ref(t));
    for cond in filter_conditions(a, f) {
        q.and_where(cond);
    }
    let order = if page.newest_first {
        Order::Desc
    } else {
        Order::Asc
    };
    let cmp = if page.newest_first { "<" } else { ">" };
    let id = format!("{}.{}", quote(al), quote(&c.id));
    match list_sort(a, page.sort) {
        None => {
            if let Some(after) = page.after {
                q.and_where(Expr::cust_with_values(format!("{id} {cmp} $1"), [after]));
            }
            q.expr_as(Expr::cust("NULL::text"), alias("sort_value"));
        }
        Some((key, ty)) => {
            if let (Some(after), Some(value)) = (page.after, &page.after_value) {
                q.and_where(Expr::cust_with_values(
                    format!("({key}, {id}) {cmp} ($1::{ty}, $2)"),
                    [
                        sea_query::Value::from(value.clone()),
                        sea_query::Value::from(after),
                    ],
                ));
            }
            q.expr_as(Expr::cust(format!("({key})::text")), alias("sort_value"))
                .order_by_expr(Expr::cust(key), order.clone());
        }
    }
    q.order_by_expr(Expr::cust(id), order)
        .limit(u64::from(page.size));
    Statement::from(&q)
}

/// A list sort's expression (NULLs folded so row comparison works) and its
/// SQL type; `None` for the id.
fn list_sort(a: &crate::admin::Admin, sort: crate::JobSort) -> Option<(String, &'static str)> {
    let (al, c) = (quote(&a.table.alias), &a.columns);
    let ts = |column: &str| format!("COALESCE({al}.{}, '-infinity'::timestamptz)", quote(column));
    match sort {
        crate::JobSort::QueuedAt => Some((ts(&c.queued_at), "timestamptz")),
        crate::JobSort::FinishedAt => Some((ts(&c.finished_at), "timestamptz")),
        crate::JobSort::Failures => Some((
            format!("COALESCE({al}.{}, 0)::integer", quote(&c.num_failures)),
            "integer",
        )),
        _ => None,
    }
}

/// The filter narrowed to the states an action may touch.
fn filter_for(f: &crate::JobFilter, states: &[JobState]) -> crate::JobFilter {
    let mut f = f.clone();
    f.states = if f.states.is_empty() {
        states.to_vec()
    } else {
        f.states
            .into_iter()
            .filter(|s| states.contains(s))
            .collect()
    };
    f
}

/// The next batch of ids a bulk action selects, after `after` (keyset by id,
/// so a batch whose jobs changed is never selected again).
pub(crate) fn admin_select_ids(
    a: &crate::admin::Admin,
    f: &crate::JobFilter,
    states: &[JobState],
    after: i64,
    size: u32,
) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let f = filter_for(f, states);
    let mut q = Query::select();
    q.expr_as(
        Expr::cust(format!("{}.{}::bigint", quote(&t.alias), quote(&c.id))),
        alias("id"),
    )
    .from(table_ref(t))
    .and_where(col(&t.alias, &c.id).gt(after));
    // No state left: the filter names only states the action may not touch.
    if f.states.is_empty() {
        q.and_where(Expr::cust("false"));
    }
    for cond in filter_conditions(a, &f) {
        q.and_where(cond);
    }
    q.order_by((alias(&t.alias), alias(&c.id)), Order::Asc)
        .limit(u64::from(size));
    Statement::from(&q)
}

/// How many jobs a bulk action would select.
pub(crate) fn admin_count(
    a: &crate::admin::Admin,
    f: &crate::JobFilter,
    states: &[JobState],
) -> Statement {
    let t = &a.table;
    let f = filter_for(f, states);
    let mut q = Query::select();
    q.expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t));
    if f.states.is_empty() {
        q.and_where(Expr::cust("false"));
    }
    for cond in filter_conditions(a, &f) {
        q.and_where(cond);
    }
    Statement::from(&q)
}

/// `UPDATE` of the jobs among `ids` still in one of `states` (checked again
/// on the row itself, so a job that moved on meanwhile is left alone).
fn admin_update(a: &crate::admin::Admin, ids: &[i64], states: &[JobState]) -> UpdateStatement {
    let t = &a.table;
    Query::update()
        .table(table_ref(t))
        .and_where(ids_in(&t.alias, &a.columns.id, ids))
        .and_where(col(&t.alias, &a.columns.state).is_in(states.iter().map(|s| state(*s))))
        .to_owned()
}

fn ids_in(a: &str, id: &str, ids: &[i64]) -> Expr {
    Expr::cust_with_values(
        format!("{}.{} = ANY($1::bigint[])", quote(a), quote(id)),
        [sea_query::Value::from(ids.to_vec())],
    )
}

/// Finished or errored jobs back to `queued`, to run now, failures reset.
pub(crate) fn admin_requeue(a: &crate::admin::Admin, ids: &[i64]) -> Statement {
    let c = &a.columns;
    let q = admin_update(a, ids, crate::BulkAction::Requeue.states())
        .value(alias(&c.state), state(JobState::Queued))
        .value(alias(&c.process_after), Expr::cust("NULL"))
        .value(alias(&c.num_failures), 0)
        .value(alias(&c.cancel), false)
        .value(alias(&c.finished_at), Expr::cust("NULL"))
        .to_owned();
    Statement::from(&q)
}

/// Waiting jobs to `canceled`.
pub(crate) fn admin_cancel_waiting(a: &crate::admin::Admin, ids: &[i64]) -> Statement {
    let c = &a.columns;
    let q = admin_update(a, ids, &[JobState::Queued, JobState::Errored])
        .value(alias(&c.state), state(JobState::Canceled))
        .value(alias(&c.cancel), true)
        .value(alias(&c.failure_message), "canceled by an operator")
        .value(alias(&c.finished_at), Expr::cust("now()"))
        .to_owned();
    Statement::from(&q)
}

/// Asks processing jobs' workers to cancel them.
pub(crate) fn admin_request_cancel(a: &crate::admin::Admin, ids: &[i64]) -> Statement {
    let q = admin_update(a, ids, &[JobState::Processing])
        .value(alias(&a.columns.cancel), true)
        .to_owned();
    Statement::from(&q)
}

/// Waiting jobs to `failed` with `message`.
pub(crate) fn admin_fail(a: &crate::admin::Admin, ids: &[i64], message: &str) -> Statement {
    let c = &a.columns;
    let q = admin_update(a, ids, &[JobState::Queued, JobState::Errored])
        .value(alias(&c.state), state(JobState::Failed))
        .value(
            alias(&c.failure_message),
            sanitize_failure_message(message).as_ref(),
        )
        .value(alias(&c.finished_at), Expr::cust("now()"))
        .to_owned();
    Statement::from(&q)
}

/// Deletes jobs no worker holds.
pub(crate) fn admin_delete(a: &crate::admin::Admin, ids: &[i64]) -> Statement {
    let t = &a.table;
    let c = &a.columns;
    let q = Query::delete()
        .from_table(table_ref(t))
        .and_where(ids_in(&t.alias, &c.id, ids))
        .and_where(col(&t.alias, &c.state).ne(state(JobState::Processing)))
        .to_owned();
    Statement::from(&q)
}

/// Jobs that finished (completed, failed, canceled) in the last `window`, per
/// state: a throughput sample for `dbworker top`. The states are exactly the
/// predicate of the retention index (`dbworker migration --retention`), so
/// the planner can use it.
pub(crate) fn admin_recent(a: &crate::admin::Admin, window: std::time::Duration) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let al = quote(&t.alias);
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("{al}.{}::text", quote(&c.state))),
            alias("state"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(Expr::cust_with_values(
            format!(
                "{al}.{} >= now() - $1 * interval '1 second'",
                quote(&c.finished_at)
            ),
            [window.as_secs_f64()],
        ))
        .and_where(
            col(&t.alias, &c.state).is_in(
                [JobState::Completed, JobState::Failed, JobState::Errored]
                    .into_iter()
                    .map(state),
            ),
        )
        .add_group_by([Expr::cust("1")])
        .to_owned();
    Statement::from(&q)
}

/// Registers a cron schedule, starting from now, unless it is known.
pub(crate) fn cron_register(cron: &Relation, job_table: &str, schedule: &str) -> Statement {
    let mut q = Query::insert();
    q.into_table(table_ref(cron))
        .columns([alias("job_table"), alias("schedule"), alias("last_tick")])
        .values_panic([
            Expr::val(job_table),
            Expr::val(schedule),
            Expr::cust("clock_timestamp()"),
        ])
        .on_conflict(
            OnConflict::columns([alias("job_table"), alias("schedule")])
                .do_nothing()
                .to_owned(),
        );
    Statement::from(&q)
}

/// Locks a schedule's row and reads its last tick and the database clock
/// (after the lock is granted), both in microseconds since the epoch.
pub(crate) fn cron_state(cron: &Relation, job_table: &str, schedule: &str) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust(format!(
                "(EXTRACT(EPOCH FROM {}.\"last_tick\") * 1000000)::bigint",
                quote(&cron.alias)
            )),
            alias("last_tick"),
        )
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint"),
            alias("now"),
        )
        .from(table_ref(cron))
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .and_where(col(&cron.alias, "schedule").eq(schedule))
        .lock(LockType::Update)
        .to_owned();
    Statement::from(&q)
}

/// Records the tick a schedule has enqueued (or skipped) up to.
pub(crate) fn cron_advance(
    cron: &Relation,
    job_table: &str,
    schedule: &str,
    tick_micros: i64,
) -> Statement {
    let q = Query::update()
        .table(table_ref(cron))
        .value(
            alias("last_tick"),
            Expr::cust_with_values(
                "timestamptz 'epoch' + $1::bigint * interval '1 microsecond'",
                [tick_micros],
            ),
        )
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .and_where(col(&cron.alias, "schedule").eq(schedule))
        .to_owned();
    Statement::from(&q)
}

/// Replaces a queue's limits; a rate starts with an empty bucket.
pub(crate) fn set_limit(
    limits: &Relation,
    job_table: &str,
    queue: &str,
    limit: &crate::Limit,
) -> Statement {
    let int = |n: Option<u32>| n.and_then(|n| i32::try_from(n).ok());
    let mut q = Query::insert();
    let updated = crate::limits::SETTINGS;
    q.into_table(table_ref(limits))
        .columns(["job_table", "queue"].into_iter().chain(updated).map(alias))
        .values_panic([
            Expr::val(job_table),
            Expr::val(queue),
            Expr::val(int(limit.max_processing)),
            Expr::val(int(limit.max_per_key)),
            Expr::val(limit.rate_per_second),
            Expr::val(int(limit.burst)),
            Expr::val(0.0f64),
            Expr::cust("now()"),
        ])
        .on_conflict(
            OnConflict::columns([alias("job_table"), alias("queue")])
                .update_columns(updated.map(alias))
                .to_owned(),
        );
    Statement::from(&q)
}

/// Removes a queue's limit.
pub(crate) fn remove_limit(limits: &Relation, job_table: &str, queue: &str) -> Statement {
    let q = Query::delete()
        .from_table(table_ref(limits))
        .and_where(col(&limits.alias, "job_table").eq(job_table))
        .and_where(col(&limits.alias, "queue").eq(queue))
        .to_owned();
    Statement::from(&q)
}

/// A job table's limits by queue.
pub(crate) fn list_limits(limits: &Relation, job_table: &str) -> Statement {
    let q = Query::select()
        .expr_as(col(&limits.alias, "queue"), alias("queue"))
        .exprs(
            ["max_processing", "max_per_key", "rate_per_second", "burst"]
                .map(|c| col(&limits.alias, c)),
        )
        .from(table_ref(limits))
        .and_where(col(&limits.alias, "job_table").eq(job_table))
        .order_by((alias(&limits.alias), alias("queue")), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Resumes the job table or one queue; returns the row it removed, if any.
pub(crate) fn resume(pauses: &Relation, job_table: &str, queue: &str) -> Statement {
    let q = Query::delete()
        .from_table(table_ref(pauses))
        .and_where(col(&pauses.alias, "job_table").eq(job_table))
        .and_where(col(&pauses.alias, "queue").eq(queue))
        .returning(Query::returning().column(alias("queue")))
        .to_owned();
    Statement::from(&q)
}

/// The job table's pauses: `(queue, paused_by, seconds paused)` by queue.
pub(crate) fn list_pauses(pauses: &Relation, job_table: &str) -> Statement {
    let q = Query::select()
        .expr_as(col(&pauses.alias, "queue"), alias("queue"))
        .expr_as(col(&pauses.alias, "paused_by"), alias("paused_by"))
        .expr_as(
            Expr::cust(format!(
                "EXTRACT(EPOCH FROM now() - {}.\"paused_at\")::float8",
                quote(&pauses.alias)
            )),
            alias("seconds"),
        )
        .from(table_ref(pauses))
        .and_where(col(&pauses.alias, "job_table").eq(job_table))
        .order_by((alias(&pauses.alias), alias("queue")), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Wakes the workers listening on `channel`.
pub(crate) fn notify(channel: &str) -> Statement {
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "pg_notify($1, '')",
            [channel.to_owned()],
        ))
        .to_owned();
    Statement::from(&q)
}

/// `COPY <table> (<columns>) FROM STDIN` in text format, for bulk loads.
pub(crate) fn copy_in(t: &Target, columns: &[String]) -> String {
    let table = t.table.quoted();
    let columns: Vec<String> = columns.iter().map(|c| quote(c)).collect();
    format!("COPY {table} ({}) FROM STDIN", columns.join(", "))
}

/// The database clock (the transaction's start) in microseconds since the epoch.
pub(crate) fn database_now_micros() -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM now()) * 1000000)::bigint"),
            alias("now"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The live job holding `key`.
pub(crate) fn live_job_with_key(t: &Target, key: &str) -> Statement {
    let key_column = t.key.clone().unwrap_or_default();
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
            key_live_states(&t.columns.state)
        )))
        .limit(1)
        .to_owned();
    Statement::from(&q)
}

/// Plans (never runs) a keyed insert: fails when no unique index matches the
/// `ON CONFLICT` target, so a missing index is reported at start-up.
pub(crate) fn explain_keyed_insert(t: &Target) -> Statement {
    let key_column = t.key.clone().unwrap_or_default();
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
        sql: format!("EXPLAIN {sql}"),
        values,
    }
}

/// The columns of a table or view, from `pg_catalog` (which, unlike
/// `information_schema`, lists columns the role has no privilege on):
/// `(name, type name, not null, has default)`. No rows: no such relation.
pub(crate) fn relation_columns(rel: &Relation) -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("a.attname::text"), alias("name"))
        .expr_as(Expr::cust("t.typname::text"), alias("type"))
        .expr_as(Expr::cust("a.attnotnull"), alias("not_null"))
        .expr_as(Expr::cust("a.atthasdef"), alias("has_default"))
        .from_as((alias("pg_catalog"), alias("pg_attribute")), alias("a"))
        .inner_join(
            TableRef::from((alias("pg_catalog"), alias("pg_type"))).alias(alias("t")),
            Expr::cust("t.oid = a.atttypid"),
        )
        .and_where(Expr::cust("a.attrelid").eq(regclass(rel)))
        .and_where(Expr::cust("a.attnum > 0 AND NOT a.attisdropped"))
        .order_by_expr(Expr::cust("a.attnum"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Whether the relation exists and what the current role may do with it:
/// `(kind, may select, may update, role)`. No row: no such relation.
pub(crate) fn relation_access(rel: &Relation) -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("c.relkind::text"), alias("kind"))
        .expr_as(
            Expr::cust("has_table_privilege(c.oid, 'SELECT')"),
            alias("may_select"),
        )
        .expr_as(
            Expr::cust("has_table_privilege(c.oid, 'UPDATE')"),
            alias("may_update"),
        )
        .expr_as(Expr::cust("current_user::text"), alias("role"))
        .from_as((alias("pg_catalog"), alias("pg_class")), alias("c"))
        .and_where(Expr::cust("c.oid").eq(regclass(rel)))
        .to_owned();
    Statement::from(&q)
}

/// A statement written as text, with its values bound in order (`$1`, `$2`…).
fn raw(sql: String, values: Vec<sea_query::Value>) -> Statement {
    Statement {
        sql,
        values: SqlxValues(sea_query::Values(values)),
    }
}

/// Registers a process; the database makes its id `host:pid:random`.
pub(crate) fn node_register(
    nodes: &Relation,
    host: &str,
    pid: i32,
    o: &crate::NodeOptions,
) -> Statement {
    raw(
        format!(
            "INSERT INTO {} (\"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\") \
             VALUES ($1 || ':' || $2 || ':' || substr(md5(random()::text || clock_timestamp()::text), 1, 8), $1, $2, $3, $4, $5) \
             RETURNING \"id\"",
            nodes.quoted()
        ),
        vec![
            host.into(),
            pid.into(),
            o.version.clone().into(),
            o.queues.clone().into(),
            i32::try_from(o.handlers).unwrap_or(i32::MAX).into(),
        ],
    )
}

/// A process's heartbeat; registers it again (keeping its id) if its row was
/// removed meanwhile.
pub(crate) fn node_heartbeat(
    nodes: &Relation,
    id: &str,
    host: &str,
    pid: i32,
    o: &crate::NodeOptions,
) -> Statement {
    raw(
        format!(
            "INSERT INTO {} (\"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\") \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (\"id\") DO UPDATE SET \"heartbeat_at\" = now()",
            nodes.quoted()
        ),
        vec![
            id.into(),
            host.into(),
            pid.into(),
            o.version.clone().into(),
            o.queues.clone().into(),
            i32::try_from(o.handlers).unwrap_or(i32::MAX).into(),
        ],
    )
}

/// Removes a process's row.
pub(crate) fn node_deregister(nodes: &Relation, id: &str) -> Statement {
    raw(
        format!("DELETE FROM {} WHERE \"id\" = $1", nodes.quoted()),
        vec![id.into()],
    )
}

/// Live processes (heartbeat younger than `dead_after`, database clock).
pub(crate) fn nodes_live(nodes: &Relation, dead_after: std::time::Duration) -> Statement {
    raw(
        format!(
            "SELECT \"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\", \
             EXTRACT(EPOCH FROM now() - \"started_at\")::float8 AS \"up\", \
             EXTRACT(EPOCH FROM now() - \"heartbeat_at\")::float8 AS \"age\" \
             FROM {} WHERE \"heartbeat_at\" >= now() - make_interval(secs => $1::float8) ORDER BY \"id\"",
            nodes.quoted()
        ),
        vec![dead_after.as_secs_f64().into()],
    )
}

/// Forgets processes dead for longer than `older_than` (their jobs were
/// rescued long since).
pub(crate) fn nodes_prune(nodes: &Relation, older_than: std::time::Duration) -> Statement {
    raw(
        format!(
            "DELETE FROM {} WHERE \"heartbeat_at\" < now() - make_interval(secs => $1::float8)",
            nodes.quoted()
        ),
        vec![older_than.as_secs_f64().into()],
    )
}

/// Takes the scope's lease if it is free or expired, or renews it if this
/// node holds it; returns the holder only when it is this node.
pub(crate) fn leader_acquire(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    lease: std::time::Duration,
) -> Statement {
    let t = leaders.quoted();
    raw(
        format!(
            "INSERT INTO {t} AS \"l\" (\"scope\", \"node_id\", \"acquired_at\", \"expires_at\") \
             VALUES ($1, $2, now(), now() + make_interval(secs => $3::float8)) \
             ON CONFLICT (\"scope\") DO UPDATE SET \"node_id\" = EXCLUDED.\"node_id\", \
               \"acquired_at\" = CASE WHEN \"l\".\"node_id\" = EXCLUDED.\"node_id\" THEN \"l\".\"acquired_at\" ELSE now() END, \
               \"expires_at\" = EXCLUDED.\"expires_at\" \
             WHERE \"l\".\"node_id\" = EXCLUDED.\"node_id\" OR \"l\".\"expires_at\" < now() \
             RETURNING \"l\".\"node_id\""
        ),
        vec![scope.into(), node_id.into(), lease.as_secs_f64().into()],
    )
}

/// Gives up the scope's lease if this node holds it.
pub(crate) fn leader_release(leaders: &Relation, scope: &str, node_id: &str) -> Statement {
    raw(
        format!(
            "DELETE FROM {} WHERE \"scope\" = $1 AND \"node_id\" = $2",
            leaders.quoted()
        ),
        vec![scope.into(), node_id.into()],
    )
}

/// The holder of the scope's unexpired lease.
pub(crate) fn leader_current(leaders: &Relation, scope: &str) -> Statement {
    raw(
        format!(
            "SELECT \"node_id\" FROM {} WHERE \"scope\" = $1 AND \"expires_at\" > now()",
            leaders.quoted()
        ),
        vec![scope.into()],
    )
}

/// Consumers assigned to `node` among `names`, with their checkpoint, that
/// have events after it (by the position index), by name, at most `limit`.
pub(crate) fn log_pending(
    l: &crate::log_store::LogResolved,
    node: &str,
    names: Vec<String>,
    limit: Option<usize>,
) -> Statement {
    let e = &l.events;
    raw(
        format!(
            "SELECT \"a\".\"consumer_name\", COALESCE(\"c\".\"last_position\", 0)::bigint AS \"last_position\" \
             FROM {assignments} AS \"a\" LEFT JOIN {checkpoints} AS \"c\" ON \"c\".\"consumer_name\" = \"a\".\"consumer_name\" \
             WHERE \"a\".\"node_id\" = $1 AND \"a\".\"consumer_name\" = ANY($2::text[]) \
               AND EXISTS (SELECT 1 FROM {events} AS {ea} WHERE {ea}.{pos} > COALESCE(\"c\".\"last_position\", 0)) \
             ORDER BY 1 LIMIT $3",
            assignments = l.assignments.quoted(),
            checkpoints = l.checkpoints.quoted(),
            events = e.quoted(),
            ea = quote(&e.alias),
            pos = quote(&l.position_column),
        ),
        vec![
            node.into(),
            names.into(),
            i64::try_from(limit.unwrap_or(usize::MAX))
                .unwrap_or(i64::MAX)
                .into(),
        ],
    )
}

/// Locks the consumer's assignment row if `node` still holds it: the proof of
/// ownership every batch transaction starts with.
pub(crate) fn log_lock_assignment(
    l: &crate::log_store::LogResolved,
    consumer: &str,
    node: &str,
) -> Statement {
    raw(
        format!(
            "SELECT 1 AS \"owned\" FROM {} WHERE \"consumer_name\" = $1 AND \"node_id\" = $2 FOR UPDATE",
            l.assignments.quoted()
        ),
        vec![consumer.into(), node.into()],
    )
}

/// The consumer's checkpoint, created at 0 when it has none.
pub(crate) fn log_checkpoint(l: &crate::log_store::LogResolved, consumer: &str) -> Statement {
    let t = l.checkpoints.quoted();
    raw(
        format!(
            "WITH \"new\" AS (INSERT INTO {t} (\"consumer_name\", \"last_position\") VALUES ($1, 0) \
               ON CONFLICT (\"consumer_name\") DO NOTHING RETURNING \"last_position\") \
             SELECT \"last_position\" FROM \"new\" UNION ALL \
             SELECT \"last_position\" FROM {t} WHERE \"consumer_name\" = $1"
        ),
        vec![consumer.into()],
    )
}

/// The next batch of events after `after`, in position order, with each
/// event's position after the configured expressions.
pub(crate) fn log_batch(l: &crate::log_store::LogResolved, after: i64, size: u32) -> Statement {
    let e = &l.events;
    let ea = quote(&e.alias);
    let pos = quote(&l.position_column);
    raw(
        format!(
            "SELECT {exprs}, {ea}.{pos}::bigint AS {position} FROM {events} AS {ea} \
             WHERE {ea}.{pos} > $1 ORDER BY {ea}.{pos} LIMIT $2",
            exprs = l.column_expressions.join(", "),
            position = quote(LOG_POSITION),
            events = e.quoted(),
        ),
        vec![after.into(), i64::from(size).into()],
    )
}

/// The column `log_batch` returns each event's position in.
pub(crate) const LOG_POSITION: &str = "dbworker_position";

/// Advances a checkpoint, fenced by the position the batch started from.
pub(crate) fn log_advance(
    l: &crate::log_store::LogResolved,
    consumer: &str,
    from: i64,
    to: i64,
) -> Statement {
    raw(
        format!(
            "UPDATE {} SET \"last_position\" = $3, \"updated_at\" = now() \
             WHERE \"consumer_name\" = $1 AND \"last_position\" = $2",
            l.checkpoints.quoted()
        ),
        vec![consumer.into(), from.into(), to.into()],
    )
}

/// The consumers `node` holds now.
pub(crate) fn log_assigned(l: &crate::log_store::LogResolved, node: &str) -> Statement {
    raw(
        format!(
            "SELECT \"consumer_name\" FROM {} WHERE \"node_id\" = $1",
            l.assignments.quoted()
        ),
        vec![node.into()],
    )
}

/// Assigns `names` (sorted) round-robin over the live nodes (sorted by id):
/// inserts missing assignments and moves those whose node changes, skipping
/// rows a running batch locks (they move at a later rebalance, once the batch
/// ends — a process cut off mid-batch keeps its consumer until its backend
/// is gone). Returns the rows it wrote.
pub(crate) fn log_rebalance(
    assignments: &Relation,
    nodes: &Relation,
    names: Vec<String>,
    dead_after: std::time::Duration,
) -> Statement {
    let t = assignments.quoted();
    raw(
        format!(
            "WITH \"live\" AS (SELECT \"id\", row_number() OVER (ORDER BY \"id\") - 1 AS \"i\", count(*) OVER () AS \"n\" \
               FROM {nodes} WHERE \"heartbeat_at\" >= now() - make_interval(secs => $2::float8)), \
             \"target\" AS (SELECT \"w\".\"name\", \"live\".\"id\" AS \"node\" \
               FROM unnest($1::text[]) WITH ORDINALITY AS \"w\"(\"name\", \"i\") \
               JOIN \"live\" ON \"live\".\"i\" = (\"w\".\"i\" - 1) % \"live\".\"n\"), \
             \"inserted\" AS (INSERT INTO {t} (\"consumer_name\", \"node_id\") \
               SELECT \"name\", \"node\" FROM \"target\" ON CONFLICT (\"consumer_name\") DO NOTHING \
               RETURNING \"consumer_name\", \"node_id\"), \
             \"movable\" AS (SELECT \"a\".\"consumer_name\", \"target\".\"node\" FROM {t} AS \"a\" \
               JOIN \"target\" ON \"target\".\"name\" = \"a\".\"consumer_name\" \
               WHERE \"a\".\"node_id\" IS DISTINCT FROM \"target\".\"node\" FOR UPDATE OF \"a\" SKIP LOCKED), \
             \"moved\" AS (UPDATE {t} AS \"a\" SET \"node_id\" = \"movable\".\"node\", \"updated_at\" = now() \
               FROM \"movable\" WHERE \"a\".\"consumer_name\" = \"movable\".\"consumer_name\" \
               RETURNING \"a\".\"consumer_name\", \"a\".\"node_id\") \
             SELECT \"consumer_name\", \"node_id\" FROM \"inserted\" UNION ALL SELECT \"consumer_name\", \"node_id\" FROM \"moved\"",
            nodes = nodes.quoted(),
        ),
        vec![names.into(), dead_after.as_secs_f64().into()],
    )
}

/// Every consumer's assignment.
pub(crate) fn log_assignments(assignments: &Relation) -> Statement {
    raw(
        format!(
            "SELECT \"consumer_name\", \"node_id\" FROM {} ORDER BY 1",
            assignments.quoted()
        ),
        Vec::new(),
    )
}

/// Each consumer's checkpoint beside the log's last position.
pub(crate) fn log_lag(
    events: &Relation,
    position_column: &str,
    checkpoints: &Relation,
) -> Statement {
    let ea = quote(&events.alias);
    let pos = quote(position_column);
    raw(
        format!(
            "SELECT \"c\".\"consumer_name\", \"c\".\"last_position\"::bigint AS \"last_position\", \
               COALESCE((SELECT max({ea}.{pos}) FROM {events} AS {ea}), 0)::bigint AS \"latest\" \
             FROM {checkpoints} AS \"c\" ORDER BY 1",
            events = events.quoted(),
            checkpoints = checkpoints.quoted(),
        ),
        Vec::new(),
    )
}

/// A query that selects nothing but makes Postgres check every configured SQL
/// fragment: the column expressions and the order-by, against the view (or table).
pub(crate) fn probe_expressions(o: &Resolved) -> Statement {
    let s = o.source();
    let mut q = Query::select();
    for e in &o.column_expressions {
        q.expr(Expr::cust(e.clone()));
    }
    q.from(table_ref(s)).and_where(Expr::cust("false"));
    order_select(&mut q, &o.order_by);
    Statement::from(&q)
}

#[cfg(test)]
mod tests;
