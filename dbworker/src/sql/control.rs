//! The control tables (pauses and limits): their own statements, and the
//! `NOT EXISTS` pause check and limit CTEs the claim is built with.

use super::claim::{CLAIMED_QUEUE, order_select};
use super::{Statement, alias, col, eligible, processing, table_ref};
use crate::columns::{Relation, quote};
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, OnConflict, Order, Query, SelectStatement, UpdateStatement};

/// The limit table's columns after its key, all replaced by `set_limit`.
pub(crate) const LIMIT_SETTINGS: [&str; 6] = [
    "max_processing",
    "max_per_key",
    "rate_per_second",
    "burst",
    "tokens",
    "refilled_at",
];

/// The name a job table is paused under: `schema.name` or `name`.
pub(crate) fn pause_key(table: &Relation) -> String {
    table.display_name()
}

/// `NOT EXISTS` a pause of the table (queue `*`) or of the row's queue, when
/// the store consults a pause table.
pub(super) fn not_paused(o: &StoreParams, a: &str) -> Option<Expr> {
    let (text, key) = not_paused_text(o, a)?;
    Some(Expr::cust_with_values(text, [key]))
}

/// [`not_paused`] as text naming its value `$1`, and that value (the
/// table's pause key), for statements written as text.
pub(super) fn not_paused_text(o: &StoreParams, a: &str) -> Option<(String, String)> {
    let pauses = o.pause_table.as_ref()?;
    let queue = match &o.queue_column {
        Some(column) => format!(" OR p.\"queue\" = {}.{}", quote(a), quote(column)),
        None => String::new(),
    };
    Some((
        format!(
            "NOT EXISTS (SELECT 1 FROM {} AS p WHERE p.\"job_table\" = $1 AND (p.\"queue\" = '*'{queue}))",
            pauses.quoted()
        ),
        pause_key(&o.table),
    ))
}

/// Through a view, `EXISTS` the table's own row of the view's row `v` (by
/// id), checked with `checks` over it (their alias is [`JOB_ROW`]), and its
/// queue not paused: in a subquery of its own alias, so neither a view that
/// shares the table's alias nor an unqualified column of a claim condition
/// or `order_by` (which read the view) meets two relations of one name.
pub(super) fn table_row_through_view(
    o: &StoreParams,
    v: &Relation,
    checks: Option<sea_query::Condition>,
) -> Option<Expr> {
    let c = &o.columns;
    let paused = not_paused(o, JOB_ROW);
    if paused.is_none() && checks.is_none() {
        return None;
    }
    let mut row = Query::select();
    row.expr(Expr::cust("1"))
        .from(super::plain_table(&o.table).alias(alias(JOB_ROW)))
        .and_where(col(JOB_ROW, &c.id).equals((alias(&v.alias), alias(&c.id))));
    if let Some(checks) = checks {
        row.cond_where(checks);
    }
    if let Some(e) = paused {
        row.and_where(e);
    }
    Some(Expr::exists(row))
}

/// The table's alias inside [`table_row_through_view`].
pub(super) const JOB_ROW: &str = "dbworker_job_row";

/// Each limited queue's room: the fewest of what its `max_processing` leaves
/// beside the jobs of that queue processing now (counted through the
/// processing partial index) and the whole tokens its rate bucket holds at
/// the statement's start; NULL when neither is limited. The bucket's level
/// and time come along, so the claim can spend what it took.
pub(super) fn queue_room(o: &StoreParams, limits: &Relation, queue: &str) -> SelectStatement {
    let c = &o.columns;
    let l = quote(&limits.alias);
    // On the HOT layout, through its live index instead.
    let live = super::and_live("\"dbworker_busy\"", c);
    let busy = format!(
        "(SELECT count(*) FROM {} AS \"dbworker_busy\" WHERE \"dbworker_busy\".{} = 'processing'{live} AND \"dbworker_busy\".{}::text = {l}.\"queue\")",
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
                "LEAST(CASE WHEN {l}.\"max_processing\" IS NOT NULL THEN GREATEST({l}.\"max_processing\" - {busy}, 0) END, CASE WHEN {l}.\"rate_per_second\" IS NOT NULL THEN LEAST(GREATEST(floor({tokens}), 0), 2147483647)::integer END)"
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
pub(super) fn busy_keys(o: &StoreParams, queue: &str, key: &str) -> SelectStatement {
    let b = "dbworker_busy";
    Query::select()
        .expr_as(Expr::cust(format!("{}.{}::text", quote(b), quote(queue))), alias("queue"))
        .expr_as(col(b, key), alias("key"))
        .expr_as(Expr::cust("count(*)"), alias("busy"))
        .from(table_ref(&Relation {
            alias: b.to_owned(),
            ..o.table.clone()
        }))
        .cond_where(processing(b, &o.columns))
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
pub(super) fn key_room(a: &str, queue: &str, key: &str) -> String {
    let (a, queue, key) = (quote(a), quote(queue), quote(key));
    format!(
        "CASE WHEN {a}.{key} IS NULL THEN NULL ELSE (SELECT \"r\".\"max_per_key\" - COALESCE((SELECT \"k\".\"busy\" FROM \"dbworker_busy_keys\" AS \"k\" WHERE \"k\".\"queue\" = {a}.{queue}::text AND \"k\".\"key\" = {a}.{key}), 0) FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"queue\" = {a}.{queue}::text) END"
    )
}

/// Ids of eligible rows, in priority order, of which each limited queue
/// contributes at most its room, and each key at most its own room (queues
/// and keys without room are skipped whole, so they never crowd out the
/// others): `window` rows are ranked per key, then per queue.
pub(super) fn within_limits(
    o: &StoreParams,
    conditions: &[Expr],
    queue: &str,
    window: u64,
) -> SelectStatement {
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
    // A scalar subquery, not NOT EXISTS: as an anti-join it made Postgres
    // read and sort every eligible row instead of walking the index in order.
    eligible_rows.and_where(Expr::cust(format!(
        "COALESCE((SELECT \"r\".\"room\" FROM \"dbworker_room\" AS \"r\" WHERE \"r\".\"queue\" = {}.{}::text), 1) > 0",
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

/// Spends the tokens of the rate-limited queues the claim took jobs from. The
/// level is computed from the bucket row being updated, not from the claim's
/// snapshot: two claims in different lanes may spend from one bucket, and the
/// second, after waiting for the first, must start from what it left.
pub(super) fn spend_tokens(o: &StoreParams, limits: &Relation) -> UpdateStatement {
    let l = quote(&limits.alias);
    let taken = format!(
        "(SELECT count(*) FROM \"dbworker_claimed\" AS \"c\" WHERE \"c\".{} = {l}.\"queue\")",
        quote(CLAIMED_QUEUE)
    );
    Query::update()
        .table(table_ref(limits))
        .value(
            alias("tokens"),
            Expr::cust(format!("{} - {taken}", bucket_level(limits))),
        )
        .value(alias("refilled_at"), Expr::cust("statement_timestamp()"))
        .and_where(col(&limits.alias, "job_table").eq(pause_key(&o.table)))
        .and_where(Expr::cust(format!(
            "{l}.\"rate_per_second\" IS NOT NULL AND {taken} > 0"
        )))
        .to_owned()
}

/// A bucket's level now: its tokens refilled at its rate since it was last
/// spent, up to its burst (by default the rate, at least 1).
fn bucket_level(limits: &Relation) -> String {
    let l = quote(&limits.alias);
    format!(
        "LEAST(COALESCE({l}.\"burst\", GREATEST(ceil({l}.\"rate_per_second\"), 1)), {l}.\"tokens\" + {l}.\"rate_per_second\" * EXTRACT(EPOCH FROM statement_timestamp() - {l}.\"refilled_at\")::float8)"
    )
}

/// The key of one claim lane of a job table.
fn lane_key(o: &StoreParams) -> String {
    format!("dbworker_claim:{}", pause_key(&o.table))
}

/// Takes every claim lane of the table, in order (so two serialized claims
/// never deadlock): the claim after it sees every claim before it.
pub(crate) fn claim_lock(o: &StoreParams, lanes: u32) -> Statement {
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "count(pg_advisory_xact_lock(hashtextextended($1, \"lane\")))",
            [lane_key(o)],
        ))
        .from_function(
            sea_query::Func::cust(alias("generate_series"))
                .args([Expr::val(0i64), Expr::val(i64::from(lanes) - 1)]),
            alias("lane"),
        )
        .to_owned();
    Statement::from(&q)
}

/// Takes one free claim lane, trying them from `first` on, without waiting:
/// its number, or no row when every lane is taken.
pub(crate) fn claim_lane(o: &StoreParams, lanes: u32, first: u32) -> Statement {
    let q = Query::select()
        .expr(Expr::cust("\"lane\""))
        .from_subquery(
            Query::select()
                .expr_as(
                    Expr::cust_with_values(
                        "((\"step\" + $1) % $2)::bigint",
                        [i64::from(first), i64::from(lanes)],
                    ),
                    alias("lane"),
                )
                .from_function(
                    sea_query::Func::cust(alias("generate_series"))
                        .args([Expr::val(0i64), Expr::val(i64::from(lanes) - 1)]),
                    alias("step"),
                )
                .to_owned(),
            alias("dbworker_lanes"),
        )
        .and_where(Expr::cust_with_values(
            "pg_try_advisory_xact_lock(hashtextextended($1, \"lane\"))",
            [lane_key(o)],
        ))
        .limit(1)
        .to_owned();
    Statement::from(&q)
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

/// A queue's limits as `set_limit` writes them (`None`: no such limit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitRow {
    pub(crate) max_processing: Option<u32>,
    pub(crate) max_per_key: Option<u32>,
    pub(crate) rate_per_second: Option<f64>,
    pub(crate) burst: Option<u32>,
}

/// Replaces a queue's limits; a rate starts with an empty bucket.
pub(crate) fn set_limit(
    limits: &Relation,
    job_table: &str,
    queue: &str,
    limit: LimitRow,
) -> Statement {
    let int = |n: Option<u32>| n.and_then(|n| i32::try_from(n).ok());
    let mut q = Query::insert();
    let updated = LIMIT_SETTINGS;
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

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{limited, pauses, quoted, quoted_pauses, rel};
    let (limited, pauses, limits) = (limited(), pauses(), rel("dbworker_limits"));
    let settings = LimitRow {
        max_processing: Some(4),
        max_per_key: Some(1),
        rate_per_second: Some(40.0),
        burst: Some(4),
    };
    let quoted = pause_key(&quoted().table);
    vec![
        ("claim_lock", claim_lock(&limited, 4)),
        ("claim_lane", claim_lane(&limited, 4, 1)),
        ("pause", pause(&pauses, "app.jobs", "emails", "ops")),
        ("resume", resume(&pauses, "app.jobs", "emails")),
        ("list_pauses", list_pauses(&pauses, "app.jobs")),
        (
            "set_limit",
            set_limit(&limits, "app.jobs", "emails", settings),
        ),
        ("remove_limit", remove_limit(&limits, "app.jobs", "emails")),
        ("list_limits", list_limits(&limits, "app.jobs")),
        (
            "pause_quoted",
            pause(&quoted_pauses(), &quoted, "emails", "ops"),
        ),
    ]
}
