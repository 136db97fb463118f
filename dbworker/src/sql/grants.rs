//! What the current role may do: the privileges each service checks at
//! start-up (`crate::grants`), read with `has_table_privilege` and
//! `has_sequence_privilege` so a missing grant is named before the first
//! statement that needs it fails.

use super::schema::regclass;
use super::{Statement, alias};
use crate::columns::Relation;
use sea_query::{Expr, ExprTrait, Query};

/// The current role's privileges on a table or view: `(may select, may
/// insert, may update, may delete, role)`. No row: no such relation (its
/// own check names it).
pub(crate) fn table_privileges(rel: &Relation) -> Statement {
    let mut q = Query::select();
    for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
        q.expr_as(
            Expr::cust(format!("has_table_privilege(c.oid, '{privilege}')")),
            alias(&format!("may_{}", privilege.to_lowercase())),
        );
    }
    q.expr_as(Expr::cust("current_user::text"), alias("role"))
        .from_as((alias("pg_catalog"), alias("pg_class")), alias("c"))
        .and_where(Expr::cust("c.oid").eq(regclass(rel)));
    Statement::from(&q)
}

/// Whether the current role may use the sequence named `quoted` (as SQL
/// writes it): `(may use, role)`. No row: no such sequence.
pub(crate) fn sequence_privilege(quoted: &str) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("has_sequence_privilege(c.oid, 'USAGE')"),
            alias("may_use"),
        )
        .expr_as(Expr::cust("current_user::text"), alias("role"))
        .from_as((alias("pg_catalog"), alias("pg_class")), alias("c"))
        .and_where(Expr::cust("c.oid").eq(Expr::cust_with_values(
            "to_regclass($1::text)",
            [quoted.to_owned()],
        )))
        .to_owned();
    Statement::from(&q)
}

/// Whether the server takes writes: `(replica, read_only)`, a standby in
/// recovery, or sessions read-only by default (`default_transaction_read_only`).
pub(crate) fn server_read_only() -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("pg_is_in_recovery()"), alias("replica"))
        .expr_as(
            Expr::cust("current_setting('default_transaction_read_only') = 'on'"),
            alias("read_only"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::resolved;
    let t = resolved(false);
    vec![
        ("table_privileges", table_privileges(&t.table)),
        (
            "sequence_privilege",
            sequence_privilege("\"jobs_workflow_seq\""),
        ),
        ("server_read_only", server_read_only()),
    ]
}
