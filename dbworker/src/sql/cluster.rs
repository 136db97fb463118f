//! The node registry and leader election by lease.
//!
//! Built with sea-query: inserts with `ON CONFLICT … DO UPDATE` (the lease's
//! `CASE` and `WHERE` over `excluded`), deletes, selects and `RETURNING`.
//! Raw text is left only in two fragments sea-query has no builder for:
//! `make_interval(secs => …)` (named-argument notation, in `interval`) and
//! `EXTRACT(EPOCH FROM …)` (in `seconds_since`); every value is bound.

use sea_query::{Func, extension::postgres::PgExpr};

use super::{Statement, alias, col, plain_table};
use crate::columns::Relation;
use sea_query::{Expr, ExprTrait, InsertStatement, LockType, OnConflict, Order, Query};

/// What a process registers about itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeRow<'a> {
    pub(crate) host: &'a str,
    pub(crate) pid: i32,
    pub(crate) version: &'a str,
    pub(crate) queues: &'a [String],
    pub(crate) handlers: u32,
    /// The control tables its workers honour; `None` when the node table
    /// has no `honours` column (made before it existed).
    pub(crate) honours: Option<&'a [String]>,
}

/// The columns a node registers, in the order of [`node_values`].
const NODE_COLUMNS: [&str; 6] = ["id", "host", "pid", "version", "queues", "handlers"];

/// An unqualified column of a table used without an alias.
fn c(name: &str) -> Expr {
    Expr::col(alias(name))
}

/// `now()`, the transaction's clock.
pub(super) fn now() -> Expr {
    Func::cust("now").into()
}

/// `make_interval(secs => $n::float8)`: the duration `d` as an interval.
fn interval(d: std::time::Duration) -> Expr {
    // Raw: sea-query cannot write a function's named argument (`secs => …`).
    Expr::cust_with_values("make_interval(secs => $1::float8)", [d.as_secs_f64()])
}

/// `now() - make_interval(secs => $n::float8)`, the database clock `ago` ago.
pub(super) fn since(ago: std::time::Duration) -> Expr {
    now().sub(interval(ago))
}

/// `CAST(EXTRACT(EPOCH FROM now() - column) AS float8)`: seconds since `column`.
fn seconds_since(column: &str) -> Expr {
    // Raw: sea-query has no `EXTRACT(field FROM …)`.
    Expr::cust_with_expr("EXTRACT(EPOCH FROM $1)", now().sub(c(column))).cast_as("float8")
}

/// A node's values after its id, in the order of [`NODE_COLUMNS`].
fn node_values(o: NodeRow<'_>) -> [Expr; 5] {
    [
        Expr::val(o.host),
        Expr::val(o.pid),
        Expr::val(o.version),
        Expr::val(o.queues.to_vec()),
        Expr::val(i32::try_from(o.handlers).unwrap_or(i32::MAX)),
    ]
}

/// An insert of a node row whose id is `id`.
fn node_insert(nodes: &Relation, id: Expr, o: NodeRow<'_>) -> InsertStatement {
    let mut q = Query::insert();
    let honours = o.honours.map(|h| Expr::val(h.to_vec()));
    q.into_table(plain_table(nodes))
        .columns(
            NODE_COLUMNS
                .iter()
                .copied()
                .chain(honours.as_ref().map(|_| "honours"))
                .map(alias),
        )
        .values_panic(std::iter::once(id).chain(node_values(o)).chain(honours));
    q
}

/// The row's `honours` as JSON, or NULL on a node table without the column
/// (`to_jsonb` of the whole row never names it, so no error either way).
fn honours_of(nodes: &Relation) -> Expr {
    Expr::cust(format!("to_jsonb({}.*) -> 'honours'", nodes.quoted()))
}

/// Registers a process; the database makes its id `host:pid:random`.
pub(crate) fn node_register(nodes: &Relation, o: NodeRow<'_>) -> Statement {
    // substr(md5(random()::text || clock_timestamp()::text), 1, 8)
    let random = Func::cust("substr").args([
        Func::md5(
            Expr::from(Func::random())
                .cast_as("text")
                .concat(Expr::from(Func::cust("clock_timestamp")).cast_as("text")),
        )
        .into(),
        Expr::Constant(1.into()),
        Expr::Constant(8.into()),
    ]);
    let id = Expr::val(o.host)
        .concat(Expr::Constant(":".into()))
        .concat(o.pid)
        .concat(Expr::Constant(":".into()))
        .concat(random);
    let mut q = node_insert(nodes, id, o);
    q.returning_col(alias("id"));
    Statement::from(&q)
}

/// A process's heartbeat; registers it again (keeping its id) if its row was
/// removed meanwhile.
pub(crate) fn node_heartbeat(nodes: &Relation, id: &str, o: NodeRow<'_>) -> Statement {
    let mut q = node_insert(nodes, Expr::val(id), o);
    q.on_conflict(
        OnConflict::column(alias("id"))
            .value(alias("heartbeat_at"), now())
            .to_owned(),
    );
    Statement::from(&q)
}

/// Removes a process's row.
pub(crate) fn node_deregister(nodes: &Relation, id: &str) -> Statement {
    let q = Query::delete()
        .from_table(plain_table(nodes))
        .and_where(c("id").eq(id))
        .to_owned();
    Statement::from(&q)
}

/// Live processes (heartbeat younger than `dead_after`, database clock).
pub(crate) fn nodes_live(nodes: &Relation, dead_after: std::time::Duration) -> Statement {
    let q = Query::select()
        .columns(NODE_COLUMNS.map(alias))
        .expr_as(honours_of(nodes), alias("honours"))
        .expr_as(seconds_since("started_at"), alias("up"))
        .expr_as(seconds_since("heartbeat_at"), alias("age"))
        .from(plain_table(nodes))
        .and_where(c("heartbeat_at").gte(since(dead_after)))
        .order_by(alias("id"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Every process the registry still holds, live or not (a dead one stays
/// until pruned), with the seconds since it started and since its heartbeat.
pub(crate) fn nodes_all(nodes: &Relation) -> Statement {
    let q = Query::select()
        .columns(NODE_COLUMNS.map(alias))
        .expr_as(honours_of(nodes), alias("honours"))
        .expr_as(seconds_since("started_at"), alias("up"))
        .expr_as(seconds_since("heartbeat_at"), alias("age"))
        .from(plain_table(nodes))
        .order_by(alias("id"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// Forgets processes dead for longer than `older_than` (their jobs were
/// rescued long since).
pub(crate) fn nodes_prune(nodes: &Relation, older_than: std::time::Duration) -> Statement {
    let q = Query::delete()
        .from_table(plain_table(nodes))
        .and_where(c("heartbeat_at").lt(since(older_than)))
        .to_owned();
    Statement::from(&q)
}

/// Takes the scope's lease if it is free or expired, or if its row still
/// names this node from an earlier term: a new term, one above the row's last
/// (the row is never deleted, so terms only grow). Returns the new term, or
/// no row when another node holds the lease. The takeover updates the row,
/// so it waits for every transaction a leader fenced with [`leader_fence`]
/// (`FOR SHARE`) to end: no write of an older term commits after it.
pub(crate) fn leader_acquire(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    lease: std::time::Duration,
) -> Statement {
    let mine = col("l", "node_id").equals((alias("excluded"), alias("node_id")));
    let q = Query::insert()
        .into_table(plain_table(leaders).alias(alias("l")))
        .columns(["scope", "node_id", "term", "acquired_at", "expires_at"].map(alias))
        .values_panic([
            Expr::val(scope),
            Expr::val(node_id),
            Expr::Constant(1.into()),
            now(),
            now().add(interval(lease)),
        ])
        .on_conflict(
            OnConflict::column(alias("scope"))
                .update_column(alias("node_id"))
                .value(alias("term"), col("l", "term").add(1))
                .value(alias("acquired_at"), now())
                .update_column(alias("expires_at"))
                .action_and_where(mine.or(col("l", "expires_at").lte(now())))
                .to_owned(),
        )
        .returning(Query::returning().column((alias("l"), alias("term"))))
        .to_owned();
    Statement::from(&q)
}

/// Renews the lease for `term` if this node still holds it in that term;
/// returns the term, or no row when the term is over.
pub(crate) fn leader_renew(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    term: i64,
    lease: std::time::Duration,
) -> Statement {
    let q = Query::update()
        .table(plain_table(leaders))
        .value(alias("expires_at"), now().add(interval(lease)))
        .and_where(c("scope").eq(scope))
        .and_where(c("node_id").eq(node_id))
        .and_where(c("term").eq(term))
        .returning_col(alias("term"))
        .to_owned();
    Statement::from(&q)
}

/// Ends this node's `term` at once (the lease expires now; the row and its
/// term stay, so the next term is a higher one).
pub(crate) fn leader_release(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    term: i64,
) -> Statement {
    let q = Query::update()
        .table(plain_table(leaders))
        .value(alias("expires_at"), now())
        .and_where(c("scope").eq(scope))
        .and_where(c("node_id").eq(node_id))
        .and_where(c("term").eq(term))
        .to_owned();
    Statement::from(&q)
}

/// The fence of a leader's write, run first in the write's transaction: locks
/// the lease row `FOR SHARE` if this node still holds it in `term` and the
/// lease has not expired (`clock_timestamp()`, not the transaction's start).
/// No row: the term is over, and the caller must roll back. While the lock is
/// held no other node can take the lease, so the transaction's writes commit
/// before any newer term begins. The transaction is also cut off if it sits
/// idle for `idle_limit` (a leader paused mid-transaction must not hold the
/// lease row, and with it every takeover, for as long as it is paused).
pub(crate) fn leader_fence(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    term: i64,
    idle_limit: std::time::Duration,
) -> Statement {
    let millis = i64::try_from(idle_limit.as_millis()).unwrap_or(i64::MAX);
    let q = Query::select()
        .expr_as(
            Func::cust("set_config").args([
                Expr::val("idle_in_transaction_session_timeout"),
                Expr::val(millis.to_string()),
                Expr::Constant(true.into()),
            ]),
            alias("idle_limit"),
        )
        .from(plain_table(leaders))
        .and_where(c("scope").eq(scope))
        .and_where(c("node_id").eq(node_id))
        .and_where(c("term").eq(term))
        .and_where(c("expires_at").gt(Func::cust("clock_timestamp")))
        .lock(LockType::Share)
        .to_owned();
    Statement::from(&q)
}

/// The holder of the scope's unexpired lease.
pub(crate) fn leader_current(leaders: &Relation, scope: &str) -> Statement {
    let q = Query::select()
        .column(alias("node_id"))
        .from(plain_table(leaders))
        .and_where(c("scope").eq(scope))
        .and_where(c("expires_at").gt(now()))
        .to_owned();
    Statement::from(&q)
}

/// Every scope's lease: its node, term, and whether it is held now (not
/// expired, database clock), by scope.
pub(crate) fn leaders_all(leaders: &Relation) -> Statement {
    let q = Query::select()
        .columns(["scope", "node_id", "term"].map(alias))
        .expr_as(c("expires_at").gt(now()), alias("held"))
        .from(plain_table(leaders))
        .order_by(alias("scope"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use std::time::Duration;
    let (nodes, leaders) = (
        super::fixtures::nodes(),
        super::fixtures::rel("dbworker_leaders"),
    );
    let queues = ["emails".to_owned()];
    let honours = ["pauses in dbworker_pauses".to_owned()];
    let node = NodeRow {
        host: "h",
        pid: 1,
        version: "0.1.0",
        queues: &queues,
        handlers: 8,
        honours: Some(&honours),
    };
    let before_honours = NodeRow {
        honours: None,
        ..node
    };
    let (id, lease) = ("h:1:ab", Duration::from_secs(15));
    vec![
        ("node_register", node_register(&nodes, node)),
        (
            "node_register_before_honours",
            node_register(&nodes, before_honours),
        ),
        ("node_heartbeat", node_heartbeat(&nodes, id, node)),
        ("node_deregister", node_deregister(&nodes, id)),
        ("nodes_live", nodes_live(&nodes, Duration::from_secs(10))),
        (
            "nodes_prune",
            nodes_prune(&nodes, Duration::from_secs(3600)),
        ),
        (
            "leader_acquire",
            leader_acquire(&leaders, "purger", id, lease),
        ),
        ("leader_release", leader_release(&leaders, "purger", id, 3)),
        (
            "leader_renew",
            leader_renew(&leaders, "purger", id, 3, lease),
        ),
        (
            "leader_fence",
            leader_fence(&leaders, "purger", id, 3, lease),
        ),
        ("leader_current", leader_current(&leaders, "purger")),
        ("nodes_all", nodes_all(&nodes)),
        ("leaders_all", leaders_all(&leaders)),
    ]
}
