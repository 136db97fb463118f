//! Start-up checks: the columns and privileges of a relation, and a probe of the
//! configured column expressions.

use super::claim::order_select;
use super::{Statement, alias, table_ref};
use crate::columns::Relation;
use crate::sql::table::StoreParams;
use sea_query::{Expr, ExprTrait, Order, Query, TableRef};

/// The relation's name as `to_regclass` takes it: quoted, and schema-qualified
/// only when configured so, so an unqualified name resolves through
/// `search_path` exactly as the other statements' names do.
pub(super) fn regclass(rel: &Relation) -> Expr {
    Expr::cust_with_values("to_regclass($1::text)", [rel.quoted()])
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
        .expr_as(Expr::cust("a.atttypmod"), alias("typmod"))
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

/// The isolation level a plain `BEGIN` starts (`isolation`): the claims,
/// marks, signals and release triggers rely on READ COMMITTED, which
/// re-checks a row updated meanwhile instead of reading a snapshot.
pub(crate) fn default_isolation() -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("current_setting('default_transaction_isolation')"),
            alias("isolation"),
        )
        .to_owned();
    Statement::from(&q)
}

/// What a generated column computes: `(generated, expression)`, where
/// `generated` is `pg_attribute.attgenerated` (`s` for a stored generated
/// column, empty otherwise) and `expression` its text. No row: no such
/// column.
pub(crate) fn generated_column(rel: &Relation, column: &str) -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("a.attgenerated::text"), alias("generated"))
        .expr_as(
            Expr::cust("pg_get_expr(d.adbin, d.adrelid)"),
            alias("expression"),
        )
        .from_as((alias("pg_catalog"), alias("pg_attribute")), alias("a"))
        .left_join(
            TableRef::from((alias("pg_catalog"), alias("pg_attrdef"))).alias(alias("d")),
            Expr::cust("d.adrelid = a.attrelid AND d.adnum = a.attnum"),
        )
        .and_where(Expr::cust("a.attrelid").eq(regclass(rel)))
        .and_where(Expr::cust("a.attname").eq(column))
        .and_where(Expr::cust("NOT a.attisdropped"))
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

/// What the current role may do to insert into the relation, whose id column
/// is `id_column`: `(may insert, the id's sequence or NULL, may use it,
/// role)`. No row: no such relation. A sequence of another kind than the
/// column's own (a default calling `nextval` of a sequence named elsewhere)
/// is not seen: `pg_get_serial_sequence` knows only owned sequences.
pub(crate) fn insert_access(rel: &Relation, id_column: &str) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("has_table_privilege(c.oid, 'INSERT')"),
            alias("may_insert"),
        )
        .expr_as(
            Expr::cust_with_values(
                "pg_get_serial_sequence(c.oid::regclass::text, $1::text)",
                [id_column.to_owned()],
            ),
            alias("sequence"),
        )
        .expr_as(
            Expr::cust_with_values(
                "COALESCE(has_sequence_privilege(pg_get_serial_sequence(c.oid::regclass::text, $1::text), 'USAGE'), true)",
                [id_column.to_owned()],
            ),
            alias("may_use_sequence"),
        )
        .expr_as(Expr::cust("current_user::text"), alias("role"))
        .from_as((alias("pg_catalog"), alias("pg_class")), alias("c"))
        .and_where(Expr::cust("c.oid").eq(regclass(rel)))
        .to_owned();
    Statement::from(&q)
}

/// A query that selects nothing but makes Postgres check every configured SQL
/// fragment: the column expressions and the order-by, against the view (or table).
pub(crate) fn probe_expressions(o: &StoreParams) -> Statement {
    let s = o.source();
    let mut q = Query::select();
    for e in &o.column_expressions {
        q.expr(Expr::cust(e.clone()));
    }
    q.from(table_ref(s)).and_where(Expr::cust("false"));
    order_select(&mut q, &o.order_by);
    Statement::from(&q)
}

/// Whether the schema-qualified relation is the one its name alone resolves
/// to through `search_path`: `(same)`. Then the name alone is how the table
/// is named everywhere (pause and limit rows, cron schedules, leases), so
/// `jobs` and `public.jobs` address the same control rows.
pub(crate) fn visible_unqualified(rel: &Relation) -> Statement {
    let bare = Relation {
        schema: None,
        ..rel.clone()
    };
    let q = Query::select()
        .expr_as(
            Expr::cust_with_values(
                "to_regclass($1::text) IS NOT NULL AND to_regclass($2::text) = to_regclass($3::text)",
                [rel.quoted(), rel.quoted(), bare.quoted()],
            ),
            alias("same"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{quoted, resolved};
    let (t, v) = (resolved(false), resolved(true));
    vec![
        ("relation_columns", relation_columns(&t.table)),
        ("default_isolation", default_isolation()),
        (
            "generated_column",
            generated_column(&t.table, crate::columns::LIVE),
        ),
        ("relation_access", relation_access(&t.table)),
        ("insert_access", insert_access(&t.table, &t.columns.id)),
        ("probe_expressions", probe_expressions(&v)),
        ("relation_access_quoted", relation_access(&quoted().table)),
        ("visible_unqualified", visible_unqualified(&quoted().table)),
    ]
}
