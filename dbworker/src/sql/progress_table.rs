//! Progress and checkpoints in the side table `<table>_progress`
//! (`dbworker migration --progress-table`), for a table without the
//! columns: every write is fenced as a write to the columns is, by the
//! claim's token (it locks the job's row as the columns' update would, so a
//! reset waits for it and a stale attempt matches nothing) and by its
//! number. A completion drops the checkpoint in its own statement.

use super::claim::cte;
use super::{Statement, StoreParams, Table, alias, col, owned, table_ref};
use crate::columns::{CHECKPOINT, PROGRESS, PROGRESS_SEQ, Relation, quote};
use sea_query::{
    Expr, ExprTrait, LockType, OnConflict, Query, TableRef, UpdateStatement, WithClause,
};

/// The side table's key, the job's id.
const JOB_ID: &str = "job_id";

/// `(checkpoint, progress_seq)` of a job its claim still owns, read through
/// its side row (none yet: no checkpoint, number 0); no row when the claim
/// moved on.
pub(crate) fn read_checkpoint_side(
    o: &StoreParams,
    side: &Relation,
    id: i64,
    token: i64,
) -> Statement {
    let t = &o.table;
    let s = &side.alias;
    let q = Query::select()
        .expr_as(col(s, CHECKPOINT), alias(CHECKPOINT))
        .expr_as(
            Expr::cust(format!(
                "COALESCE({}.{}, 0)::bigint",
                quote(s),
                quote(PROGRESS_SEQ)
            )),
            alias(PROGRESS_SEQ),
        )
        .from(table_ref(t))
        .left_join(
            table_ref(side),
            col(s, JOB_ID).equals((alias(&t.alias), alias(&o.columns.id))),
        )
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned();
    Statement::from(&q)
}

/// The side-table form of [`write_progress`](super::write_progress): the
/// job's row locked (`FOR NO KEY UPDATE`, as the columns' update locks it)
/// only while the claim owns it, then the side row inserted or, if its
/// number is below `number`, updated. Returns `(progress_seq)`, or no row
/// when the claim moved on or a newer write landed first.
pub(crate) fn write_progress_side(
    o: &StoreParams,
    side: &Relation,
    (id, token): (i64, i64),
    number: i64,
    progress: Option<serde_json::Value>,
    checkpoint: Option<serde_json::Value>,
) -> Statement {
    let t = &o.table;
    let s = &side.alias;
    let owner = Query::select()
        .expr_as(col(&t.alias, &o.columns.id), alias("id"))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .lock(LockType::NoKeyUpdate)
        .to_owned();
    let row = Query::select()
        .column(alias("id"))
        .expr(Expr::val(progress.clone()))
        .expr(Expr::val(checkpoint.clone()))
        .expr(Expr::val(number))
        .from(alias("dbworker_owner"))
        .to_owned();
    let mut conflict = OnConflict::column(alias(JOB_ID));
    conflict.update_column(alias(PROGRESS_SEQ));
    if progress.is_some() {
        conflict.update_column(alias(PROGRESS));
    }
    if checkpoint.is_some() {
        conflict.update_column(alias(CHECKPOINT));
    }
    conflict.action_and_where(col(s, PROGRESS_SEQ).lt(number));
    let mut insert = Query::insert();
    insert
        .into_table(table_ref(side))
        .columns([JOB_ID, PROGRESS, CHECKPOINT, PROGRESS_SEQ].map(alias))
        .on_conflict(conflict.to_owned())
        .returning(Query::returning().column((alias(s), alias(PROGRESS_SEQ))));
    // Four columns, four values: it always fits.
    let fits = insert.select_from(row).is_ok();
    debug_assert!(fits, "the side row's insert");
    let mut with = WithClause::new();
    with.cte(cte(owner, "dbworker_owner", true));
    Statement::from(&insert.with(with))
}

/// A completion's statement: `mark` itself, or on a table with the side
/// table [`completion_side`].
pub(crate) fn completion(mark: UpdateStatement, a: &Table) -> Statement {
    match &a.progress_table {
        Some(side) => completion_side(mark, a, side),
        None => Statement::from(&mark),
    }
}

/// A completion's statement on a table with the side table: `mark` (a
/// fenced completion of the job table) returning the ids it marked, and the
/// side rows of those jobs losing their checkpoint (their progress stays) in
/// the same statement. Returns the marked ids as `id`, one row each.
fn completion_side(mark: UpdateStatement, a: &Table, side: &Relation) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let mut mark = mark;
    mark.returning(Query::returning().expr(Expr::cust(format!(
        "{}.{}::bigint AS \"id\"",
        quote(&t.alias),
        quote(&c.id)
    ))));
    checkpoints_dropped(mark, WithClause::new(), side, &["id"], None)
}

/// `mark` (a fenced mark returning each row it marked as `id`, and the
/// other `returned` columns) run in `with`, and the side rows of the jobs it
/// marked losing their checkpoint in the same statement: all of them, or
/// with `completed` (the name of the column `mark` returns the state in)
/// only those it completed. Returns `mark`'s rows.
pub(super) fn checkpoints_dropped(
    mark: UpdateStatement,
    mut with: WithClause,
    side: &Relation,
    returned: &[&str],
    completed: Option<&str>,
) -> Statement {
    let mut marked = Query::select();
    marked.column(alias("id")).from(alias("dbworker_marked"));
    if let Some(state) = completed {
        marked.and_where(col("dbworker_marked", state).eq(Expr::cust(format!(
            "'{}'",
            workerutil::JobState::Completed.as_str()
        ))));
    }
    let drop = Query::update()
        .table(table_ref(side))
        .value(alias(CHECKPOINT), Expr::cust("NULL"))
        .and_where(col(&side.alias, JOB_ID).in_subquery(marked.to_owned()))
        .to_owned();
    with.cte(cte(mark, "dbworker_marked", false))
        .cte(cte(drop, "dbworker_dropped", false));
    let q = Query::select()
        .columns(returned.iter().map(|c| alias(c)))
        .from(alias("dbworker_marked"))
        .to_owned();
    Statement::from(&q.with(with))
}

/// The heartbeat's write of the reported progress to the side table: one
/// row per job `touched` (a CTE of the ids the beat refreshed, still owned
/// and locked), its report found by key in `reports` (a CTE of one object,
/// `v`, keyed by job id, of `[number, value]`); each lands only above the
/// side row's number, and returns its job's id as `id`.
pub(crate) fn heartbeat_side(
    side: &Relation,
    reports: &str,
    touched: &str,
) -> sea_query::InsertStatement {
    let s = &side.alias;
    let object = format!("(SELECT \"v\" FROM {})", quote(reports));
    let id = format!("{}.\"id\"", quote(touched));
    let row = Query::select()
        .expr(Expr::cust(id.clone()))
        .expr(Expr::cust(format!("{object} -> {id}::text -> 1")))
        .expr(Expr::cust(format!(
            "({object} -> {id}::text ->> 0)::bigint"
        )))
        .from(alias(touched))
        .and_where(Expr::cust(format!("jsonb_exists({object}, {id}::text)")))
        .to_owned();
    let mut insert = Query::insert();
    insert
        .into_table(table_ref(side))
        .columns([JOB_ID, PROGRESS, PROGRESS_SEQ].map(alias))
        .on_conflict(
            OnConflict::column(alias(JOB_ID))
                .update_columns([alias(PROGRESS), alias(PROGRESS_SEQ)])
                .action_and_where(
                    col(s, PROGRESS_SEQ)
                        .lt(Expr::cust(format!("EXCLUDED.{}", quote(PROGRESS_SEQ)))),
                )
                .to_owned(),
        )
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(s),
            quote(JOB_ID)
        ))));
    let fits = insert.select_from(row).is_ok();
    debug_assert!(fits, "the heartbeat's side insert");
    insert
}

/// The side table joined to the job table's alias on the job's id, for the
/// readers that show a job's progress (the running jobs, a job's row).
pub(super) fn join_side(a: &Table, side: &Relation) -> (TableRef, Expr) {
    (
        table_ref(side),
        col(&side.alias, JOB_ID).equals((alias(&a.table.alias), alias(&a.columns.id))),
    )
}

/// The purge's deletion of the purged jobs' side rows, as a CTE over
/// `moved` (the deleted rows, their id as the table's id column).
pub(super) fn purge_side(side: &Relation, id_column: &str, moved: &str) -> String {
    format!(
        ", \"dbworker_progress_gone\" AS (DELETE FROM {} WHERE {} IN (SELECT {}::bigint FROM {}))",
        side.quoted(),
        quote(JOB_ID),
        quote(id_column),
        quote(moved)
    )
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{rel, resolved};
    let t = resolved(false);
    let side = rel("app.jobs_progress");
    let v = serde_json::json!({"rows": 10});
    let mark = super::marks::fenced_update(&t, 1, 2)
        .value(alias("state"), "completed")
        .to_owned();
    vec![
        (
            "read_checkpoint_side",
            read_checkpoint_side(&t, &side, 1, 2),
        ),
        (
            "write_progress_side",
            write_progress_side(&t, &side, (1, 2), 3, Some(v.clone()), Some(v.clone())),
        ),
        (
            "write_progress_side_checkpoint",
            write_progress_side(&t, &side, (1, 2), 3, None, Some(v)),
        ),
        ("completion", completion(mark.clone(), &t)),
        ("completion_side", {
            let mut with_side = t.clone();
            with_side.progress_table = Some(side.clone());
            completion(mark, &with_side)
        }),
    ]
}
