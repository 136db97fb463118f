//! A partitioned job table's partitions: creating upcoming ones, and retention
//! by detaching and dropping whole partitions (the purger's fast path).
//!
//! The DDL statements here (`DETACH PARTITION`, `DROP TABLE`, `SET LOCAL`) are
//! raw text: sea-query has no builder for them, and `SET` takes no bound values.
//! Every name in them is quoted and the one number is formatted from an integer.

use std::time::Duration;

use sea_query::JoinType;

use super::purge::{Archive, RecordedBy, recorded};
use super::schema::regclass;
use super::{Statement, alias, col, plain_table, state};
use crate::columns::create_partitions_function;
use crate::columns::{Columns, Relation, quote};
use sea_query::{Condition, Expr, ExprTrait, Order, Query};
use sea_query_sqlx::SqlxValues;
use workerutil::JobState;

/// The upper bound of a partition's range, as text, read from its bound
/// expression (`FOR VALUES FROM ('…') TO ('…')`); NULL for the default
/// partition.
const UPPER_BOUND_TEXT: &str =
    r#"(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]"#;

/// The partitions of `table` whose range ended before `now()`, oldest first:
/// `(schema, name)`. No row can be queued into them any more (unless inserted
/// with an explicit old `queued_at`). The default partition is never listed.
///
/// The bounds are cast to `timestamptz` only after the table's own
/// partitions are chosen: `OFFSET 0` keeps the planner from pushing the cast
/// down to a scan of `pg_class`, where it would meet every other partitioned
/// table's bounds (`TO ('m')` of a table partitioned by text) and fail the
/// whole statement.
pub(crate) fn closed_partitions(table: &Relation) -> Statement {
    const OWN: &str = "dbworker_own";
    let own = Query::select()
        .expr_as(Expr::cust("n.nspname::text"), alias("schema"))
        .expr_as(Expr::cust("c.relname::text"), alias("name"))
        .expr_as(Expr::cust(UPPER_BOUND_TEXT), alias("upper_bound"))
        .from_as((alias("pg_catalog"), alias("pg_inherits")), alias("i"))
        .join_as(
            JoinType::InnerJoin,
            (alias("pg_catalog"), alias("pg_class")),
            alias("c"),
            Expr::cust("c.oid = i.inhrelid"),
        )
        .join_as(
            JoinType::InnerJoin,
            (alias("pg_catalog"), alias("pg_namespace")),
            alias("n"),
            Expr::cust("n.oid = c.relnamespace"),
        )
        .and_where(Expr::cust("i.inhparent").eq(regclass(table)))
        .offset(0)
        .to_owned();
    let upper = format!("{}.\"upper_bound\"::timestamptz", quote(OWN));
    let q = Query::select()
        .column((alias(OWN), alias("schema")))
        .column((alias(OWN), alias("name")))
        .from_subquery(own, alias(OWN))
        .and_where(Expr::cust(format!("{upper} <= now()")))
        .order_by_expr(Expr::cust(upper), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

const P: &str = "dbworker_partition";

/// `NOT <purgeable>` over a partition aliased [`P`]: a row the purger must
/// keep (not in a purged state, finished more recently than its state's age,
/// with no `finished_at`, or not yet recorded by `history`).
fn kept_row(c: &Columns, max_age: &[(JobState, Duration)], history: Option<&RecordedBy>) -> Expr {
    let finished_at = format!("{}.{}", quote(P), quote(&c.finished_at));
    let mut purgeable = Condition::any();
    for (s, age) in max_age {
        let mut row = col(P, &c.state).eq(state(*s)).and(Expr::cust_with_values(
            format!("{finished_at} < now() - make_interval(secs => $1::float8)"),
            [age.as_secs_f64()],
        ));
        if let Some(r) = history {
            row = row.and(recorded(r, finished_at.clone()));
        }
        purgeable = purgeable.add(row);
    }
    let purgeable = if max_age.is_empty() {
        Expr::cust("false")
    } else {
        // NULL (no finished_at) counts as kept.
        Expr::cust_with_expr("COALESCE($1, false)", purgeable)
    };
    purgeable.not()
}

/// Whether one partition holds a row the purger must keep: the first look,
/// which stops at the first such row (a partition of live jobs costs little).
pub(crate) fn partition_keeps_rows(
    partition: &Relation,
    c: &Columns,
    max_age: &[(JobState, Duration)],
    history: Option<&RecordedBy>,
) -> Statement {
    let kept = Query::select()
        .expr(Expr::cust("1"))
        .from(plain_table(partition).alias(alias(P)))
        .and_where(kept_row(c, max_age, history))
        .to_owned();
    let q = Query::select()
        .expr_as(Expr::exists(kept), alias("kept"))
        .to_owned();
    Statement::from(&q)
}

/// `(rows, kept)` of one partition: how many rows it holds, and how many the
/// purger must keep. Run after the detach: a partition is dropped only when
/// `kept` is 0.
pub(crate) fn partition_rows(
    partition: &Relation,
    c: &Columns,
    max_age: &[(JobState, Duration)],
    history: Option<&RecordedBy>,
) -> Statement {
    let kept = Query::select()
        .expr(Expr::cust("count(*)"))
        .from(plain_table(partition).alias(alias(P)))
        .and_where(kept_row(c, max_age, history))
        .to_owned();
    let q = Query::select()
        .expr_as(Expr::cust("count(*)::bigint"), alias("rows"))
        .expr_as(Expr::expr(kept), alias("kept"))
        .from(plain_table(partition).alias(alias("dbworker_all")))
        .to_owned();
    Statement::from(&q)
}

fn raw(sql: String) -> Statement {
    Statement {
        sql: sql.into(),
        values: SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// `SET LOCAL lock_timeout`: how long the purger's transaction waits for the
/// job table's lock before it gives up on a partition for this pass (claims
/// queue behind a waiting `DETACH`, so the wait must be short).
pub(crate) fn set_lock_timeout(timeout: Duration) -> Statement {
    raw(format!(
        "SET LOCAL lock_timeout = '{}ms'",
        timeout.as_millis().max(1)
    ))
}

/// `ALTER TABLE t DETACH PARTITION p`, in the purger's transaction: takes
/// `ACCESS EXCLUSIVE` on both until commit (not `CONCURRENTLY`: Postgres refuses
/// it while the table has a default partition, and it cannot run in the
/// transaction that re-checks the rows).
pub(crate) fn detach_partition(table: &Relation, partition: &Relation) -> Statement {
    raw(format!(
        "ALTER TABLE {} DETACH PARTITION {}",
        table.quoted(),
        partition.quoted()
    ))
}

/// `INSERT INTO archive (c, …) SELECT c, … FROM p`: a dropped partition's
/// rows kept in the archive table, copied by column name.
pub(crate) fn archive_partition(archive: &Archive, partition: &Relation) -> Statement {
    raw(archive.insert_from(&partition.quoted()))
}

/// `DROP TABLE p`: a detached partition whose every row was purgeable.
pub(crate) fn drop_partition(partition: &Relation) -> Statement {
    raw(format!("DROP TABLE {}", partition.quoted()))
}

/// Calls `<table>_create_partitions(ahead)`: the names of the partitions it
/// created.
pub(crate) fn create_partitions(table: &Relation, ahead: u32) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust_with_values(
                format!("{}($1::integer)", create_partitions_function(table)),
                [i64::from(ahead)],
            ),
            alias("partition"),
        )
        .to_owned();
    Statement::from(&q)
}

/// Whether `<table>_create_partitions` exists (the start-up check).
pub(crate) fn create_partitions_exists(table: &Relation) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust_with_values(
                "to_regproc($1::text) IS NOT NULL",
                [create_partitions_function(table)],
            ),
            alias("exists"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{rel, renamed};
    let (table, partition) = (rel("app.example_jobs"), rel("app.example_jobs_p20261124"));
    let c = renamed();
    let max_age = [
        (JobState::Completed, Duration::from_secs(60)),
        (JobState::Failed, Duration::from_secs(3600)),
    ];
    vec![
        ("closed_partitions", closed_partitions(&table)),
        (
            "partition_rows",
            partition_rows(&partition, &c, &max_age, None),
        ),
        (
            "partition_keeps_rows",
            partition_keeps_rows(&partition, &c, &max_age[..1], None),
        ),
        (
            "partition_keeps_rows_recorded_by_history",
            partition_keeps_rows(
                &partition,
                &c,
                &max_age[..1],
                Some(&super::fixtures::recorded_by()),
            ),
        ),
        (
            "partition_rows_none_purged",
            partition_rows(&partition, &c, &[], None),
        ),
        (
            "set_lock_timeout",
            set_lock_timeout(Duration::from_millis(1500)),
        ),
        ("detach_partition", detach_partition(&table, &partition)),
        (
            "archive_partition",
            archive_partition(
                &Archive {
                    table: rel("app.archive"),
                    columns: vec!["id".into(), "state".into()],
                },
                &partition,
            ),
        ),
        ("drop_partition", drop_partition(&partition)),
        ("create_partitions", create_partitions(&table, 3)),
        ("create_partitions_exists", create_partitions_exists(&table)),
    ]
}
