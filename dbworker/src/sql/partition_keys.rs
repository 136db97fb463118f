//! Keyed inserts on a partitioned job table. Such a table can have no unique
//! index on the key alone (Postgres requires the partition key in it), so there
//! is no `ON CONFLICT` arbiter: the key table `<table>_keys`, kept in step by
//! the table's triggers (`ddl::partitioned_keys_sql`), says who holds a key, and
//! its primary key refuses a second live holder.

use super::claim::cte;
use super::{Statement, Table, alias, col, plain_table};
use crate::columns::{Relation, quote};
use crate::sql::enqueue::{
    ENQUEUE_ALIAS, JobRow, OnKey, as_new, enqueue_columns, enqueue_target, no_failed_holder,
    old_work_dropped, replaced_columns,
};
use sea_query::{Expr, ExprTrait, LockType, Query, WithClause};

/// Inserts a keyed job into a partitioned table, with [`enqueue_keyed`]'s
/// results: `(id, inserted)` for a new job or an updated waiting holder, no
/// row when a processing holder or a dedupe mode keeps the key.
///
/// The holder's key row is locked first (`FOR UPDATE`), so concurrent
/// enqueuers of one key queue behind each other, and a holder that finishes
/// meanwhile (its trigger deletes the key row) frees the key for this insert.
/// Two enqueuers that both find no holder both insert: the second's trigger
/// then fails with a unique violation on the key table, and the caller retries
/// (in a savepoint), finding the first one's job as the holder.
pub(crate) fn enqueue_keyed_partitioned(
    t: &Table,
    keys: &Relation,
    job: &JobRow<'_>,
    key: &str,
    mode: OnKey,
) -> Statement {
    const HOLDER: &str = "dbworker_holder";
    const UPDATED: &str = "dbworker_updated";
    const INSERTED: &str = "dbworker_inserted";
    let c = &t.columns;
    let row = enqueue_columns(t, job, Some(key));
    let returning = |inserted: bool| {
        Query::returning().exprs([
            Expr::cust(format!(
                "{}.{}::bigint AS \"id\"",
                quote(ENQUEUE_ALIAS),
                quote(&c.id)
            )),
            Expr::cust(format!("{inserted} AS \"inserted\"")),
        ])
    };
    let mut with = WithClause::new();
    let holder = Query::select()
        .column(alias("job_id"))
        .from(plain_table(keys))
        .and_where(Expr::col(alias("job_key")).eq(key))
        .lock(LockType::Update)
        .to_owned();
    with.cte(cte(holder, HOLDER, true));
    let holder_ids = Query::select()
        .column(alias("job_id"))
        .from(alias(HOLDER))
        .to_owned();

    let mut select = Query::select();
    select
        .exprs(row.iter().map(|(_, e)| e.clone()))
        .and_where(Expr::exists(holder_ids.clone()).not());
    if mode == OnKey::UnsafeDedupe {
        select.and_where(no_failed_holder(t, key));
    }
    let mut insert = Query::insert();
    insert
        .into_table(enqueue_target(t))
        .columns(row.iter().map(|(c, _)| alias(c)))
        .select_from(select)
        .expect("the select has one expression per column")
        .returning(returning(true));
    with.cte(cte(insert, INSERTED, false));

    let mut result = Query::select();
    result
        .column((alias(INSERTED), sea_query::Asterisk))
        .from(alias(INSERTED));
    if mode.replaces() {
        // A waiting holder takes the new values, as `ON CONFLICT DO UPDATE` would.
        let replaced = replaced_columns(t, job, mode);
        let mut update = Query::update();
        update.table(enqueue_target(t));
        for column in &replaced {
            // A column the job leaves unset takes its default, like `excluded.x`.
            let value = row
                .iter()
                .find(|(c, _)| c == column)
                .map_or_else(|| Expr::cust("DEFAULT"), |(_, v)| v.clone());
            update.value(alias(column), value);
        }
        // The new run time, or the column's default (NULL: at once).
        let new_run_at = row
            .iter()
            .find(|(column, _)| *column == c.process_after)
            .map_or_else(|| Expr::cust("NULL"), |(_, v)| v.clone());
        update
            .values(as_new(t, mode, new_run_at))
            .and_where(col(ENQUEUE_ALIAS, &c.id).in_subquery(holder_ids))
            .and_where(Expr::cust(format!(
                "{}.{} IN ('queued', 'errored')",
                quote(ENQUEUE_ALIAS),
                quote(&c.state)
            )))
            .returning(returning(false));
        with.cte(cte(update, UPDATED, false));
        if let Some(side) = &t.progress_table {
            let replaced = Query::select()
                .column(alias("id"))
                .from(alias(UPDATED))
                .to_owned();
            with.cte(cte(
                old_work_dropped(side, replaced),
                "dbworker_dropped",
                false,
            ));
        }
        result.union(
            sea_query::UnionType::All,
            Query::select()
                .column((alias(UPDATED), sea_query::Asterisk))
                .from(alias(UPDATED))
                .to_owned(),
        );
    }
    Statement::from(&result.with(with))
}

/// The key triggers `table` has: `(name, enabled)`, enabled unless
/// `ALTER TABLE … DISABLE TRIGGER` turned it off. `pg_trigger` is readable by
/// every role, so a reader's start-up can ask too.
pub(crate) fn key_trigger_states(table: &Relation) -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("tgname::text"), alias("name"))
        .expr_as(Expr::cust("tgenabled <> 'D'"), alias("enabled"))
        .from((alias("pg_catalog"), alias("pg_trigger")))
        .and_where(Expr::cust_with_values(
            "tgrelid = to_regclass($1::text) AND tgname = ANY($2::text[])",
            [
                sea_query::Value::from(table.quoted()),
                sea_query::Value::from(crate::columns::key_triggers(table).to_vec()),
            ],
        ))
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{enqueue_target, keyed, payload, rel};
    let (e, keys, values) = (enqueue_target(), rel("app.example_jobs_keys"), payload("p"));
    let job = keyed(&values);
    vec![
        (
            "enqueue_keyed_partitioned_replace",
            enqueue_keyed_partitioned(&e, &keys, &job, "k", OnKey::Replace),
        ),
        (
            "enqueue_keyed_partitioned_replace_side_progress",
            enqueue_keyed_partitioned(
                &Table {
                    progress_table: Some(rel("app.example_jobs_progress")),
                    ..enqueue_target()
                },
                &keys,
                &job,
                "k",
                OnKey::Replace,
            ),
        ),
        (
            "enqueue_keyed_partitioned_unsafe_dedupe",
            enqueue_keyed_partitioned(&e, &keys, &job, "k", OnKey::UnsafeDedupe),
        ),
        ("key_trigger_states", key_trigger_states(&e.table)),
    ]
}
