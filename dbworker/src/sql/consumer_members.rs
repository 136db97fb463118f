//! Log consumers' group membership: which processes run each group. Each
//! process of a group keeps its own row fresh (and removes it when it stops);
//! the leader's rebalance deals the group's consumers only over members whose
//! row and registry heartbeat are both recent, and forgets stale rows in the
//! same transaction fenced by its term. Every timestamp is the database's.

use sea_query::{Expr, ExprTrait, OnConflict, Query};

use super::{Statement, alias, plain_table};
use crate::columns::Relation;
use crate::sql::cluster::{now, since};

/// An unqualified column.
fn c(name: &str) -> Expr {
    Expr::col(alias(name))
}

/// Records (or refreshes) that `node` runs `group`, stamped `now()`.
pub(crate) fn log_member_beat(members: &Relation, group: &str, node: &str) -> Statement {
    let q = Query::insert()
        .into_table(plain_table(members))
        .columns([alias("group_name"), alias("node_id"), alias("heartbeat_at")])
        .values_panic([Expr::val(group), Expr::val(node), now()])
        .on_conflict(
            OnConflict::columns([alias("group_name"), alias("node_id")])
                .value(alias("heartbeat_at"), now())
                .to_owned(),
        )
        .to_owned();
    Statement::from(&q)
}

/// `node` no longer runs `group` (a graceful stop): the next rebalance
/// deals its consumers to the others.
pub(crate) fn log_member_leave(members: &Relation, group: &str, node: &str) -> Statement {
    let q = Query::delete()
        .from_table(plain_table(members))
        .and_where(c("group_name").eq(group))
        .and_where(c("node_id").eq(node))
        .to_owned();
    Statement::from(&q)
}

/// The leader forgets the group's members not heard from for `stale` (killed
/// processes), so the table does not grow with every restart.
pub(crate) fn log_members_prune(
    members: &Relation,
    group: &str,
    stale: std::time::Duration,
) -> Statement {
    let q = Query::delete()
        .from_table(plain_table(members))
        .and_where(c("group_name").eq(group))
        .and_where(c("heartbeat_at").lt(since(stale)))
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let members = super::fixtures::rel("dbworker_consumer_members");
    let (group, node) = ("projections", "h:1:ab");
    vec![
        ("log_member_beat", log_member_beat(&members, group, node)),
        ("log_member_leave", log_member_leave(&members, group, node)),
        (
            "log_members_prune",
            log_members_prune(&members, group, std::time::Duration::from_secs(10)),
        ),
    ]
}
