//! Progress and checkpoints: a claimed job's fenced read of its checkpoint,
//! and its fenced writes, each naming the write count it read.

use super::{Statement, StoreParams, alias, col, owned, table_ref};
use crate::columns::{CHECKPOINT, PROGRESS, PROGRESS_SEQ};
use sea_query::{Expr, ExprTrait, Query};

/// The checkpoint and write count of a job its claim still owns:
/// `(checkpoint, progress_seq)`, or no row.
pub(crate) fn read_checkpoint(o: &StoreParams, id: i64, token: i64) -> Statement {
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
/// if its write count is still `seq` (the one the writer read; `None`: not
/// read yet, any), and counts the write: returns `(progress_seq)`, or no row
/// when the claim or the count moved on.
pub(crate) fn write_progress(
    o: &StoreParams,
    id: i64,
    token: i64,
    seq: Option<i64>,
    progress: Option<serde_json::Value>,
    checkpoint: Option<serde_json::Value>,
) -> Statement {
    let t = &o.table;
    let mut q = Query::update();
    q.table(table_ref(t))
        .value(alias(PROGRESS_SEQ), col(&t.alias, PROGRESS_SEQ).add(1i64))
        .cond_where(owned(&t.alias, &o.columns, id, token));
    if let Some(progress) = progress {
        q.value(alias(PROGRESS), Expr::val(progress));
    }
    if let Some(checkpoint) = checkpoint {
        q.value(alias(CHECKPOINT), Expr::val(checkpoint));
    }
    if let Some(seq) = seq {
        q.and_where(col(&t.alias, PROGRESS_SEQ).eq(seq));
    }
    q.returning(Query::returning().column(alias(PROGRESS_SEQ)));
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::resolved;
    let t = resolved(false);
    let v = serde_json::json!({"rows": 10});
    vec![
        ("read_checkpoint", read_checkpoint(&t, 1, 2)),
        (
            "write_progress",
            write_progress(&t, 1, 2, Some(3), Some(v.clone()), Some(v.clone())),
        ),
        (
            "write_progress_first",
            write_progress(&t, 1, 2, None, None, Some(v)),
        ),
    ]
}
