//! Progress and checkpoints: a claimed job's fenced read of its checkpoint,
//! and its fenced writes, each numbered above the newest one landed; the
//! running jobs with their progress, as operators see them.

use super::progress_table::{join_side, read_checkpoint_side, write_progress_side};
use super::{Statement, StoreParams, Table, alias, col, owned, quote, state, table_ref};
use crate::columns::{CHECKPOINT, PROGRESS, PROGRESS_SEQ};
use sea_query::{Expr, ExprTrait, Order, Query};
use workerutil::JobState;

/// What a claim on a table that keeps progress returns besides the
/// [`RECORD_ID`](super::RECORD_ID) columns: the row's `progress_seq` (the
/// side row's, 0 without one), above which the attempt numbers its writes.
pub(crate) const CLAIMED_PROGRESS_SEQ: &str = "dbworker_progress_seq";

/// The checkpoint and write number of a job its claim still owns:
/// `(checkpoint, progress_seq)`, or no row.
pub(crate) fn read_checkpoint(o: &StoreParams, id: i64, token: i64) -> Statement {
    if let Some(side) = &o.progress_table {
        return read_checkpoint_side(o, side, id, token);
    }
    let t = &o.table;
    let q = Query::select()
        .expr_as(col(&t.alias, CHECKPOINT), alias(CHECKPOINT))
        .expr_as(col(&t.alias, PROGRESS_SEQ), alias(PROGRESS_SEQ))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned();
    Statement::from(&q)
}

/// Writes the progress and/or the checkpoint of a job its claim still owns,
/// as write `number` of its attempt, if no write numbered as high landed
/// (`progress_seq < number`, then set to it): returns `(progress_seq)`, or
/// no row when the claim moved on or a newer write landed first.
pub(crate) fn write_progress(
    o: &StoreParams,
    (id, token): (i64, i64),
    number: i64,
    progress: Option<serde_json::Value>,
    checkpoint: Option<serde_json::Value>,
) -> Statement {
    if let Some(side) = &o.progress_table {
        return write_progress_side(o, side, (id, token), number, progress, checkpoint);
    }
    let t = &o.table;
    let mut q = Query::update();
    q.table(table_ref(t))
        .value(alias(PROGRESS_SEQ), Expr::val(number))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .and_where(col(&t.alias, PROGRESS_SEQ).lt(number));
    if let Some(progress) = progress {
        q.value(alias(PROGRESS), Expr::val(progress));
    }
    if let Some(checkpoint) = checkpoint {
        q.value(alias(CHECKPOINT), Expr::val(checkpoint));
    }
    q.returning(Query::returning().column(alias(PROGRESS_SEQ)));
    Statement::from(&q)
}

/// The claim's `RETURNING` term on a table that keeps progress (see
/// [`CLAIMED_PROGRESS_SEQ`]).
pub(super) fn progress_returning(o: &StoreParams) -> Option<Expr> {
    let (a, c) = (&o.table.alias, &o.columns);
    let seq = match &o.progress_table {
        Some(side) => format!(
            "COALESCE((SELECT \"dbworker_side\".{seq} FROM {} AS \"dbworker_side\" WHERE \"dbworker_side\".\"job_id\" = {}.{}), 0)",
            side.quoted(),
            quote(a),
            quote(&c.id),
            seq = quote(PROGRESS_SEQ),
        ),
        None if o.progress => format!("{}.{}", quote(a), quote(PROGRESS_SEQ)),
        None => return None,
    };
    Some(Expr::cust(format!(
        "{seq}::bigint AS {}",
        quote(CLAIMED_PROGRESS_SEQ)
    )))
}

/// The `limit` longest-running processing jobs: `(id, host, running_for
/// (seconds, database clock), progress)`; `progress` is NULL on a table
/// that keeps none, read from the side table on a table that keeps it there.
/// Read through the processing rows only.
pub(crate) fn running_jobs(a: &Table, limit: u64) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let progress = match &a.progress_table {
        Some(side) => col(&side.alias, PROGRESS),
        None if a.progress => col(&t.alias, PROGRESS),
        None => Expr::cust("NULL::jsonb"),
    };
    let mut q = Query::select();
    if let Some(side) = &a.progress_table {
        let (side, on) = join_side(a, side);
        q.left_join(side, on);
    }
    let q = q
        .expr_as(col(&t.alias, &c.id), alias("id"))
        .expr_as(
            Expr::cust(format!(
                "{}.{}::text",
                quote(&t.alias),
                quote(&c.worker_hostname)
            )),
            alias("host"),
        )
        .expr_as(
            Expr::cust(format!(
                "EXTRACT(EPOCH FROM now() - {}.{})::float8",
                quote(&t.alias),
                quote(&c.started_at)
            )),
            alias("running_for"),
        )
        .expr_as(progress, alias(PROGRESS))
        .from(table_ref(t))
        .and_where(col(&t.alias, &c.state).eq(state(JobState::Processing)))
        .order_by((alias(&t.alias), alias(&c.started_at)), Order::Asc)
        .order_by((alias(&t.alias), alias(&c.id)), Order::Asc)
        .limit(limit)
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::resolved;
    let t = resolved(false);
    let v = serde_json::json!({"rows": 10});
    let mut with_progress = resolved(false);
    with_progress.progress = true;
    let mut side = resolved(false);
    side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
    vec![
        ("read_checkpoint", read_checkpoint(&t, 1, 2)),
        (
            "write_progress",
            write_progress(&t, (1, 2), 3, Some(v.clone()), Some(v.clone())),
        ),
        (
            "write_progress_checkpoint",
            write_progress(&t, (1, 2), 3, None, Some(v)),
        ),
        ("running_jobs", running_jobs(&with_progress, 20)),
        ("running_jobs_no_progress", running_jobs(&t, 20)),
        ("running_jobs_side", running_jobs(&side, 20)),
    ]
}
