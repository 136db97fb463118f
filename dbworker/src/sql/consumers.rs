//! Log consumers: assignments, checkpoints and batches of the events table.
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

use sea_query::{BinOper, Func, PgFunc, UnionType, WindowStatement};

use super::*;

/// The events table and the consumers' control tables.
#[derive(Debug, Clone)]
pub(crate) struct LogTables {
    pub(crate) events: Relation,
    pub(crate) position_column: String,
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

/// `SELECT "consumer_name", "node_id" FROM "cte"`.
fn assignment_rows(from: &str) -> SelectStatement {
    Query::select()
        .columns([alias("consumer_name"), alias("node_id")])
        .from(alias(from))
        .to_owned()
}

/// Consumers assigned to `node` among `names`, with their checkpoint, that
/// have events after it (by the position index), by name, at most `limit`.
pub(crate) fn log_pending(
    l: &LogTables,
    node: &str,
    names: Vec<String>,
    limit: Option<usize>,
) -> Statement {
    let e = &l.events;
    let checkpoint = Func::coalesce([col("c", "last_position"), int(0)]);
    let newer = Query::select()
        .expr(int(1))
        .from(table_ref(e))
        .and_where(col(&e.alias, &l.position_column).gt(checkpoint.clone()))
        .to_owned();
    let mut q = Query::select();
    q.expr(col("a", "consumer_name"))
        .expr_as(
            Expr::from(checkpoint).cast_as("bigint"),
            alias("last_position"),
        )
        .from(plain_table(&l.assignments).alias(alias("a")))
        .left_join(
            plain_table(&l.checkpoints).alias(alias("c")),
            col("c", "consumer_name").equals((alias("a"), alias("consumer_name"))),
        )
        .and_where(col("a", "node_id").eq(node))
        .and_where(col("a", "consumer_name").eq(PgFunc::any(Expr::val(names).cast_as("text[]"))))
        .and_where(Expr::exists(newer))
        .order_by((alias("a"), alias("consumer_name")), Order::Asc);
    if let Some(limit) = limit {
        // The bound LIMIT is a bigint.
        let most = i64::MAX.unsigned_abs();
        q.limit(Ord::min(u64::try_from(limit).unwrap_or(most), most));
    }
    Statement::from(&q)
}

/// The consumers among `names` assigned to `node`, each with its checkpoint
/// and whether the log has events after it: the dispatched claim, which must
/// also learn which consumers are held and caught up, so it need not ask again
/// until the log's head moves.
pub(crate) fn log_held(l: &LogTables, node: &str, names: Vec<String>) -> Statement {
    let e = &l.events;
    let checkpoint = Func::coalesce([col("c", "last_position"), int(0)]);
    let newer = Query::select()
        .expr(int(1))
        .from(table_ref(e))
        .and_where(col(&e.alias, &l.position_column).gt(checkpoint.clone()))
        .to_owned();
    let q = Query::select()
        .expr(col("a", "consumer_name"))
        .expr_as(
            Expr::from(checkpoint).cast_as("bigint"),
            alias("last_position"),
        )
        .expr_as(Expr::exists(newer), alias("pending"))
        .from(plain_table(&l.assignments).alias(alias("a")))
        .left_join(
            plain_table(&l.checkpoints).alias(alias("c")),
            col("c", "consumer_name").equals((alias("a"), alias("consumer_name"))),
        )
        .and_where(col("a", "node_id").eq(node))
        .and_where(col("a", "consumer_name").eq(PgFunc::any(Expr::val(names).cast_as("text[]"))))
        .order_by((alias("a"), alias("consumer_name")), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The log's head: its greatest position (0 when empty), one probe of the
/// position index. The dispatcher reads it; a scoped batch reads it to know
/// how far its checkpoint may advance past events of other types.
pub(crate) fn log_head(l: &LogTables) -> Statement {
    let e = &l.events;
    let q = Query::select()
        .expr_as(
            Expr::from(Func::coalesce([
                Func::max(col(&e.alias, &l.position_column)).into(),
                int(0),
            ]))
            .cast_as("bigint"),
            alias(LOG_HEAD),
        )
        .from(table_ref(e))
        .to_owned();
    Statement::from(&q)
}

/// The column `log_head` returns the head in.
pub(crate) const LOG_HEAD: &str = "head";

/// A scoped consumer's next batch: the events after `after` and up to `upto`
/// (the head read before it) whose aggregate type is one of `types`, in
/// position order. Filtered here, so the consumer never receives the others.
pub(crate) fn log_scoped_batch(
    l: &LogTables,
    after: i64,
    upto: i64,
    types: Vec<String>,
    size: u32,
) -> Statement {
    let e = &l.events;
    let position = col(&e.alias, &l.position_column);
    let mut q = Query::select();
    for expr in &l.column_expressions {
        q.expr(Expr::cust(expr.clone()));
    }
    q.expr_as(position.clone().cast_as("bigint"), alias(LOG_POSITION))
        .from(table_ref(e))
        .and_where(position.clone().gt(after))
        .and_where(position.clone().lte(upto))
        .and_where(
            col(&e.alias, &l.type_column).eq(PgFunc::any(Expr::val(types).cast_as("text[]"))),
        )
        .order_by_expr(position, Order::Asc)
        .limit(u64::from(size));
    Statement::from(&q)
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

/// The consumer's checkpoint, created at 0 when it has none.
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
        .returning_col(alias("last_position"))
        .to_owned();
    let existing = Query::select()
        .column(alias("last_position"))
        .from(plain_table(&l.checkpoints))
        .and_where(c("consumer_name").eq(consumer))
        .to_owned();
    let q = Query::select()
        .column(alias("last_position"))
        .from(alias("new"))
        .union(UnionType::All, existing)
        .to_owned()
        .with(WithClause::new().cte(cte(create, "new", false)).to_owned());
    Statement::from(&q)
}

/// The next batch of events after `after`, in position order, with each
/// event's position after the configured expressions.
pub(crate) fn log_batch(l: &LogTables, after: i64, size: u32) -> Statement {
    let e = &l.events;
    let position = col(&e.alias, &l.position_column);
    let mut q = Query::select();
    for expr in &l.column_expressions {
        q.expr(Expr::cust(expr.clone()));
    }
    q.expr_as(position.clone().cast_as("bigint"), alias(LOG_POSITION))
        .from(table_ref(e))
        .and_where(position.clone().gt(after))
        .order_by_expr(position, Order::Asc)
        .limit(u64::from(size));
    Statement::from(&q)
}

/// The column `log_batch` returns each event's position in.
pub(crate) const LOG_POSITION: &str = "dbworker_position";

/// Advances a checkpoint, fenced by the position the batch started from.
pub(crate) fn log_advance(l: &LogTables, consumer: &str, from: i64, to: i64) -> Statement {
    let q = Query::update()
        .table(plain_table(&l.checkpoints))
        .value(alias("last_position"), to)
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
    // The live nodes, numbered from 1 by id, and how many there are.
    let live = Query::select()
        .column(alias("id"))
        .expr_window_as(
            Func::cust("row_number"),
            WindowStatement::new()
                .order_by(alias("id"), Order::Asc)
                .to_owned(),
            alias("i"),
        )
        .expr_window_as(
            Func::count(Expr::col(sea_query::Asterisk)),
            WindowStatement::new(),
            alias("n"),
        )
        .from(plain_table(nodes))
        .and_where(c("heartbeat_at").gte(since(dead_after)))
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
