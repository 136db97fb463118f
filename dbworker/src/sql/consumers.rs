//! Log consumers: assignments, checkpoints and slices of the events table.
//!
//! Built with sea-query: the pending check joins the checkpoints with
//! `LEFT JOIN` and tests the events table with `EXISTS`; the checkpoint and the
//! rebalance are data-modifying CTEs (`WITH … AS (INSERT …/UPDATE … RETURNING …)`)
//! read through `UNION ALL`, and the rebalance numbers nodes with window
//! functions and locks with `FOR UPDATE OF "a" SKIP LOCKED`. sea-query cannot
//! write `unnest(..) WITH ORDINALITY` as a FROM item, so the rebalance numbers
//! the names with `unnest` and `generate_subscripts` side by side instead. Raw
//! text is left only where sea-query has no builder, each marked where it is:
//! the `IS DISTINCT FROM` operator, `make_interval(secs => …)` (the cluster's
//! `since`), and the configured column expressions, which are SQL by design.
//! Every value is bound.

use sea_query::{BinOper, Func, JoinType, PgFunc, UnionType, WindowStatement};

use super::claim::{cte, lock_skip};
use super::{Statement, alias, col, plain_table, table_ref};
use crate::columns::Relation;
use crate::sql::cluster::{now, since};
use sea_query::{
    Expr, ExprTrait, LockType, OnConflict, Order, Query, SelectStatement, TableRef, WithClause,
};

/// The events table and the consumers' control tables.
#[derive(Debug, Clone)]
pub(crate) struct LogTables {
    pub(crate) events: Relation,
    pub(crate) position_column: String,
    /// The `xid8` column holding each event's writing transaction.
    pub(crate) transaction_column: String,
    pub(crate) column_expressions: Vec<String>,
    pub(crate) assignments: Relation,
    pub(crate) checkpoints: Relation,
    /// The column a scoped consumer's aggregate types are matched against.
    pub(crate) type_column: String,
}

/// An unqualified column.
fn c(name: &str) -> Expr {
    Expr::col(alias(name))
}

/// An integer literal (rendered, not bound: a constant of the statement).
fn int(n: i32) -> Expr {
    Expr::Constant(n.into())
}

/// `pg_snapshot_xmin(pg_current_snapshot())`: every transaction id below it
/// has ended (committed or rolled back), and no transaction running now or
/// started later can have one below it. Events written below it are final.
fn horizon() -> Expr {
    Func::cust("pg_snapshot_xmin")
        .arg(Func::cust("pg_current_snapshot"))
        .into()
}

/// A transaction id sent as a bigint, as `xid8` (no direct cast exists).
fn xid8(xid: i64) -> Expr {
    Expr::val(xid).cast_as("text").cast_as("xid8")
}

/// An `xid8` column read back as a bigint.
fn xid_out(e: Expr) -> Expr {
    e.cast_as("text").cast_as("bigint")
}

/// `'0'::xid8`, the checkpoint of a consumer that has read nothing.
fn xid_zero() -> Expr {
    // Raw: a typed constant; sea-query has no xid8 literal.
    Expr::cust("'0'::xid8")
}

/// An event's place in the reading order: `(transaction, position)`.
fn point(l: &LogTables) -> Expr {
    let e = &l.events;
    Expr::tuple([
        col(&e.alias, &l.transaction_column),
        col(&e.alias, &l.position_column),
    ])
}

/// A checkpoint's place in the reading order, from the checkpoint row `c`
/// (the start of the log when the consumer has none yet).
fn checkpoint_point() -> Expr {
    Expr::tuple([
        Func::coalesce([col("c", "last_xid"), xid_zero()]).into(),
        Func::coalesce([col("c", "last_position"), int(0)]).into(),
    ])
}

/// `EXISTS` a final event after the checkpoint row `c`.
fn final_event_after_checkpoint(l: &LogTables) -> Expr {
    let e = &l.events;
    let newer = Query::select()
        .expr(int(1))
        .from(table_ref(e))
        .and_where(point(l).gt(checkpoint_point()))
        .and_where(col(&e.alias, &l.transaction_column).lt(horizon()))
        .to_owned();
    Expr::exists(newer)
}

/// `SELECT "consumer_name", "node_id" FROM "cte"`.
fn assignment_rows(from: &str) -> SelectStatement {
    Query::select()
        .columns([alias("consumer_name"), alias("node_id")])
        .from(alias(from))
        .to_owned()
}

/// Consumers assigned to `node` among `names`, with their checkpoint, that
/// have final events after it (by the `(transaction, position)` index), by
/// name, at most `limit`.
pub(crate) fn log_pending(
    l: &LogTables,
    node: &str,
    names: Vec<String>,
    limit: Option<usize>,
) -> Statement {
    let mut q = held_query(l, node, names);
    q.and_where(final_event_after_checkpoint(l));
    if let Some(limit) = limit {
        // The bound LIMIT is a bigint.
        let most = i64::MAX.unsigned_abs();
        q.limit(Ord::min(u64::try_from(limit).unwrap_or(most), most));
    }
    Statement::from(&q)
}

/// The consumers among `names` assigned to `node`, each with its checkpoint
/// and whether the log has final events after it: the dispatched claim, which
/// must also learn which consumers are held and caught up, so it need not ask
/// again until the log's head moves.
pub(crate) fn log_held(l: &LogTables, node: &str, names: Vec<String>) -> Statement {
    let mut q = held_query(l, node, names);
    q.expr_as(final_event_after_checkpoint(l), alias("pending"));
    Statement::from(&q)
}

/// The consumers among `names` assigned to `node` with their checkpoints
/// (`last_xid`, `last_position`; zero without one), by name.
fn held_query(l: &LogTables, node: &str, names: Vec<String>) -> SelectStatement {
    Query::select()
        .expr(col("a", "consumer_name"))
        .expr_as(
            xid_out(Func::coalesce([col("c", "last_xid"), xid_zero()]).into()),
            alias("last_xid"),
        )
        .expr_as(
            Expr::from(Func::coalesce([col("c", "last_position"), int(0)])).cast_as("bigint"),
            alias("last_position"),
        )
        .from(plain_table(&l.assignments).alias(alias("a")))
        .left_join(
            plain_table(&l.checkpoints).alias(alias("c")),
            col("c", "consumer_name").equals((alias("a"), alias("consumer_name"))),
        )
        .and_where(col("a", "node_id").eq(node))
        .and_where(col("a", "consumer_name").eq(PgFunc::any(Expr::val(names).cast_as("text[]"))))
        .order_by((alias("a"), alias("consumer_name")), Order::Asc)
        .to_owned()
}

/// The log's head: its last final event in reading order (`head_xid`,
/// `head`; zero when there is none), and whether committed events wait behind
/// a transaction still running (`waiting`: the head moves when that
/// transaction ends, and no insert announces it). Two probes of the
/// `(transaction, position)` index. The dispatcher reads it; a scoped slice
/// reads it to know how far its checkpoint may advance past events of other
/// types.
pub(crate) fn log_head(l: &LogTables) -> Statement {
    let e = &l.events;
    let txn = col(&e.alias, &l.transaction_column);
    let last = Query::select()
        .expr_as(xid_out(txn.clone()), alias("x"))
        .expr_as(
            col(&e.alias, &l.position_column).cast_as("bigint"),
            alias("p"),
        )
        .from(table_ref(e))
        .and_where(txn.clone().lt(horizon()))
        .order_by_expr(txn.clone(), Order::Desc)
        .order_by_expr(col(&e.alias, &l.position_column), Order::Desc)
        .limit(1)
        .to_owned();
    let waiting = Query::select()
        .expr(int(1))
        .from(table_ref(e))
        .and_where(txn.gte(horizon()))
        .to_owned();
    // One row whether or not the log has a final event: `(SELECT 1) AS one
    // LEFT JOIN (…) AS h ON true`.
    let q = Query::select()
        .expr_as(
            Expr::from(Func::coalesce([col("h", "x"), int(0)])).cast_as("bigint"),
            alias(LOG_HEAD_XID),
        )
        .expr_as(
            Expr::from(Func::coalesce([col("h", "p"), int(0)])).cast_as("bigint"),
            alias(LOG_HEAD),
        )
        .expr_as(Expr::exists(waiting), alias(LOG_WAITING))
        .from_subquery(Query::select().expr(int(1)).to_owned(), alias("one"))
        .join_subquery(JoinType::LeftJoin, last, alias("h"), Expr::cust("true"))
        .to_owned();
    Statement::from(&q)
}

/// The column `log_head` returns the head's position in.
pub(crate) const LOG_HEAD: &str = "head";
/// The column `log_head` returns the head's transaction id in.
pub(crate) const LOG_HEAD_XID: &str = "head_xid";
/// The column `log_head` says whether events wait behind a running writer in.
pub(crate) const LOG_WAITING: &str = "waiting";

/// A scoped consumer's next slice: the events after `after` and up to `upto`
/// (the head read before it; both `(transaction, position)`) whose aggregate
/// type is one of `types`, in reading order. Filtered here, so the consumer
/// never receives the others.
pub(crate) fn log_scoped_slice(
    l: &LogTables,
    after: (i64, i64),
    upto: (i64, i64),
    types: Vec<String>,
    size: u32,
) -> Statement {
    let e = &l.events;
    let mut q = slice_select(l);
    q.and_where(point(l).gt(Expr::tuple([xid8(after.0), Expr::val(after.1)])))
        .and_where(point(l).lte(Expr::tuple([xid8(upto.0), Expr::val(upto.1)])))
        .and_where(
            col(&e.alias, &l.type_column).eq(PgFunc::any(Expr::val(types).cast_as("text[]"))),
        )
        .limit(u64::from(size));
    Statement::from(&q)
}

/// The configured select list, each event's position and transaction, in
/// reading order.
fn slice_select(l: &LogTables) -> SelectStatement {
    let e = &l.events;
    let position = col(&e.alias, &l.position_column);
    let txn = col(&e.alias, &l.transaction_column);
    let mut q = Query::select();
    for expr in &l.column_expressions {
        q.expr(Expr::cust(expr.clone()));
    }
    q.expr_as(position.clone().cast_as("bigint"), alias(LOG_POSITION))
        .expr_as(xid_out(txn.clone()), alias(LOG_XID))
        .from(table_ref(e))
        .order_by_expr(txn, Order::Asc)
        .order_by_expr(position, Order::Asc);
    q
}

/// Locks the consumer's assignment row if `node` still holds it: the proof of
/// ownership every batch transaction starts with.
pub(crate) fn log_lock_assignment(l: &LogTables, consumer: &str, node: &str) -> Statement {
    let q = Query::select()
        .expr_as(int(1), alias("owned"))
        .from(plain_table(&l.assignments))
        .and_where(c("consumer_name").eq(consumer))
        .and_where(c("node_id").eq(node))
        .lock(LockType::Update)
        .to_owned();
    Statement::from(&q)
}

/// The consumer's checkpoint (`last_xid`, `last_position`), created at the
/// start of the log when it has none.
pub(crate) fn log_checkpoint(l: &LogTables, consumer: &str) -> Statement {
    let create = Query::insert()
        .into_table(plain_table(&l.checkpoints))
        .columns([alias("consumer_name"), alias("last_position")])
        .values_panic([Expr::val(consumer), int(0)])
        .on_conflict(
            OnConflict::column(alias("consumer_name"))
                .do_nothing()
                .to_owned(),
        )
        .returning(Query::returning().columns([alias("last_xid"), alias("last_position")]))
        .to_owned();
    let read = |from: TableRef| {
        Query::select()
            .expr_as(xid_out(c("last_xid")), alias("last_xid"))
            .column(alias("last_position"))
            .from(from)
            .to_owned()
    };
    let mut existing = read(plain_table(&l.checkpoints));
    existing.and_where(c("consumer_name").eq(consumer));
    let q = read(alias("new").into())
        .union(UnionType::All, existing)
        .to_owned()
        .with(WithClause::new().cte(cte(create, "new", false)).to_owned());
    Statement::from(&q)
}

/// The next slice of final events after `after` (`(transaction, position)`),
/// in reading order, with each event's position and transaction after the
/// configured expressions. An event whose transaction is below the horizon
/// can no longer be preceded by one that commits later, so the checkpoint
/// may pass it.
pub(crate) fn log_slice(l: &LogTables, after: (i64, i64), size: u32) -> Statement {
    let e = &l.events;
    let mut q = slice_select(l);
    q.and_where(point(l).gt(Expr::tuple([xid8(after.0), Expr::val(after.1)])))
        .and_where(col(&e.alias, &l.transaction_column).lt(horizon()))
        .limit(u64::from(size));
    Statement::from(&q)
}

/// The column `log_slice` returns each event's position in.
pub(crate) const LOG_POSITION: &str = "dbworker_position";
/// The column `log_slice` returns each event's transaction id in.
pub(crate) const LOG_XID: &str = "dbworker_xid";

/// Advances a checkpoint to `to` (`(transaction, position)`), fenced by the
/// position the batch started from (positions are unique, so the position
/// alone names the checkpoint).
pub(crate) fn log_advance(l: &LogTables, consumer: &str, from: i64, to: (i64, i64)) -> Statement {
    let q = Query::update()
        .table(plain_table(&l.checkpoints))
        .value(alias("last_xid"), xid8(to.0))
        .value(alias("last_position"), to.1)
        .value(alias("updated_at"), now())
        .and_where(c("consumer_name").eq(consumer))
        .and_where(c("last_position").eq(from))
        .to_owned();
    Statement::from(&q)
}

/// The consumers `node` holds now.
pub(crate) fn log_assigned(l: &LogTables, node: &str) -> Statement {
    let q = Query::select()
        .column(alias("consumer_name"))
        .from(plain_table(&l.assignments))
        .and_where(c("node_id").eq(node))
        .to_owned();
    Statement::from(&q)
}

/// Assigns `names` (sorted) round-robin over the live members of `group`
/// (sorted by id): nodes whose registry heartbeat is within `dead_after` and
/// whose membership row of the group is within `fresh` (a process registered
/// for anything else runs none of the group's consumers):
/// inserts missing assignments and moves those whose node changes, skipping
/// rows a running batch locks (they move at a later rebalance, once the batch
/// ends — a process cut off mid-batch keeps its consumer until its backend
/// is gone). Returns the rows it wrote.
pub(crate) fn log_rebalance(
    assignments: &Relation,
    nodes: &Relation,
    members: &Relation,
    group: &str,
    names: Vec<String>,
    dead_after: std::time::Duration,
    fresh: std::time::Duration,
) -> Statement {
    // The live members, numbered from 1 by id, and how many there are.
    let live = Query::select()
        .expr_as(col("r", "id"), alias("id"))
        .expr_window_as(
            Func::cust("row_number"),
            WindowStatement::new()
                .order_by((alias("r"), alias("id")), Order::Asc)
                .to_owned(),
            alias("i"),
        )
        .expr_window_as(
            Func::count(Expr::col(sea_query::Asterisk)),
            WindowStatement::new(),
            alias("n"),
        )
        .from(plain_table(nodes).alias(alias("r")))
        .inner_join(
            plain_table(members).alias(alias("m")),
            col("m", "node_id")
                .equals((alias("r"), alias("id")))
                .and(col("m", "group_name").eq(group))
                .and(col("m", "heartbeat_at").gte(since(fresh))),
        )
        .and_where(col("r", "heartbeat_at").gte(since(dead_after)))
        .to_owned();
    // The names with their position in the array (from 1). sea-query cannot
    // write `unnest(..) WITH ORDINALITY` as a FROM item; two set-returning
    // functions in one select list run in lockstep, which pairs the same.
    let wanted = Query::select()
        .expr_as(
            Func::cust("unnest").arg(Expr::val(names.clone()).cast_as("text[]")),
            alias("name"),
        )
        .expr_as(
            Func::cust("generate_subscripts").args([Expr::val(names).cast_as("text[]"), int(1)]),
            alias("i"),
        )
        .to_owned();
    let target = Query::select()
        .column((alias("w"), alias("name")))
        .expr_as(col("live", "id"), alias("node"))
        .from_subquery(wanted, alias("w"))
        .inner_join(
            alias("live"),
            col("live", "i").eq(col("w", "i")
                .sub(int(1))
                .modulo(col("live", "n"))
                .add(int(1))),
        )
        .to_owned();
    let inserted = Query::insert()
        .into_table(plain_table(assignments))
        .columns([alias("consumer_name"), alias("node_id")])
        .select_from(
            Query::select()
                .columns([alias("name"), alias("node")])
                .from(alias("target"))
                .to_owned(),
        )
        .expect("two columns from two")
        .on_conflict(
            OnConflict::column(alias("consumer_name"))
                .do_nothing()
                .to_owned(),
        )
        .returning(Query::returning().columns([alias("consumer_name"), alias("node_id")]))
        .to_owned();
    let mut movable = Query::select();
    movable
        .column((alias("a"), alias("consumer_name")))
        .column((alias("target"), alias("node")))
        .from(plain_table(assignments).alias(alias("a")))
        .inner_join(
            alias("target"),
            col("target", "name").equals((alias("a"), alias("consumer_name"))),
        )
        // Raw operator: sea-query has no `IS DISTINCT FROM`.
        .and_where(
            col("a", "node_id").binary(BinOper::Custom("IS DISTINCT FROM"), col("target", "node")),
        );
    lock_skip(&mut movable, "a");
    let moved = Query::update()
        .table(plain_table(assignments).alias(alias("a")))
        .value(alias("node_id"), col("movable", "node"))
        .value(alias("updated_at"), now())
        .from(alias("movable"))
        .and_where(col("a", "consumer_name").equals((alias("movable"), alias("consumer_name"))))
        .returning(Query::returning().columns([
            (alias("a"), alias("consumer_name")),
            (alias("a"), alias("node_id")),
        ]))
        .to_owned();
    let q = assignment_rows("inserted")
        .union(UnionType::All, assignment_rows("moved"))
        .to_owned()
        .with(
            WithClause::new()
                .cte(cte(live, "live", false))
                .cte(cte(target, "target", false))
                .cte(cte(inserted, "inserted", false))
                .cte(cte(movable, "movable", false))
                .cte(cte(moved, "moved", false))
                .to_owned(),
        );
    Statement::from(&q)
}

/// Every consumer's assignment.
pub(crate) fn log_assignments(assignments: &Relation) -> Statement {
    let q = Query::select()
        .columns([alias("consumer_name"), alias("node_id")])
        .from(plain_table(assignments))
        .order_by(alias("consumer_name"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Each consumer's checkpoint beside the log's last position.
pub(crate) fn log_lag(
    events: &Relation,
    position_column: &str,
    checkpoints: &Relation,
) -> Statement {
    let latest = Query::select()
        .expr(Func::max(col(&events.alias, position_column)))
        .from(table_ref(events))
        .to_owned();
    let q = Query::select()
        .expr(col("c", "consumer_name"))
        .expr_as(
            col("c", "last_position").cast_as("bigint"),
            alias("last_position"),
        )
        .expr_as(
            Expr::from(Func::coalesce([Expr::from(latest), int(0)])).cast_as("bigint"),
            alias("latest"),
        )
        .from(plain_table(checkpoints).alias(alias("c")))
        .order_by((alias("c"), alias("consumer_name")), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let (l, nodes) = (super::fixtures::log_tables(), super::fixtures::nodes());
    let (node, billing) = ("h:1:ab", || vec!["billing".to_owned()]);
    let ten_seconds = std::time::Duration::from_secs(10);
    vec![
        ("log_pending", log_pending(&l, node, billing(), Some(4))),
        (
            "log_lock_assignment",
            log_lock_assignment(&l, "billing", node),
        ),
        ("log_held", log_held(&l, node, billing())),
        ("log_head", log_head(&l)),
        (
            "log_scoped_slice",
            log_scoped_slice(&l, (7, 10), (9, 500), vec!["order".into()], 100),
        ),
        ("log_checkpoint", log_checkpoint(&l, "billing")),
        ("log_slice", log_slice(&l, (7, 10), 100)),
        ("log_advance", log_advance(&l, "billing", 10, (9, 20))),
        ("log_assigned", log_assigned(&l, node)),
        (
            "log_rebalance",
            log_rebalance(
                &l.assignments,
                &nodes,
                &super::fixtures::rel("dbworker_consumer_members"),
                "projections",
                billing(),
                ten_seconds,
                ten_seconds,
            ),
        ),
        ("log_assignments", log_assignments(&l.assignments)),
        (
            "log_lag",
            log_lag(&l.events, &l.position_column, &l.checkpoints),
        ),
    ]
}
