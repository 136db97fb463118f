//! Every state counted for an operator (`Admin::status`), never by a scan of
//! the whole table: the live states through the partial indexes every job
//! table has (waiting, processing), pending jobs through the dependency
//! table, the finished states through the retention index when the table has
//! one (`finished_at`, over the final states), else as the planner's estimate.

use sea_query::Value;
use sea_query_sqlx::SqlxValues;
use workerutil::JobState;

use super::{Statement, Table};
use crate::columns::{deps_table, quote};

/// The final states, exactly as the retention index's predicate lists them,
/// so the planner can prove it applies.
const FINISHED: &str = "'completed', 'failed', 'canceled'";

/// The queue column as text, or NULL for a table without one.
fn queue_text(a: &Table) -> String {
    match &a.queue_column {
        Some(column) => format!("{}.{}::text", quote(&a.table.alias), quote(column)),
        None => "NULL::text".to_owned(),
    }
}

fn values(v: Vec<Value>) -> SqlxValues {
    SqlxValues(sea_query::Values(v))
}

/// Live jobs per state and queue: `(state, queue, count, later, stalled,
/// oldest)`. `later`: waiting jobs whose `process_after` is still ahead
/// (scheduled, or an errored job's retry delay); `stalled`: processing jobs
/// whose heartbeat (or, before the first, whose start) is older than `$1`
/// seconds; `oldest`: seconds the longest-waiting due job has been runnable
/// (since it was queued or, if later, since its `process_after`). One
/// branch per partial index (waiting, processing) and, with workflows, one
/// for pending jobs through the dependency table (a pending job waits for at
/// least one row there; the table has no index on the pending state).
pub(crate) fn counts_live(a: &Table, stalled_age: std::time::Duration) -> Statement {
    let al = quote(&a.table.alias);
    let c = &a.columns;
    let (st, table) = (format!("{al}.{}", quote(&c.state)), a.table.quoted());
    let queue = queue_text(a);
    let now_due = format!(
        "COALESCE({al}.{}, '-infinity') <= now()",
        quote(&c.process_after)
    );
    let waiting = format!(
        "SELECT {st}::text AS \"state\", {queue} AS \"queue\", count(*)::bigint AS \"count\", \
         (count(*) FILTER (WHERE NOT ({now_due})))::bigint AS \"later\", 0::bigint AS \"stalled\", \
         COALESCE(EXTRACT(EPOCH FROM now() - min(GREATEST({al}.{queued_at}, {al}.{process_after})) FILTER (WHERE {now_due})), 0)::float8 AS \"oldest\" \
         FROM {table} AS {al} WHERE {st} IN ('queued', 'errored'){live} GROUP BY 1, 2",
        live = super::and_live(&al, c),
        queued_at = quote(&c.queued_at),
        process_after = quote(&c.process_after),
    );
    let processing = format!(
        "SELECT {st}::text, {queue}, count(*)::bigint, 0::bigint, \
         (count(*) FILTER (WHERE COALESCE({al}.{heartbeat}, {al}.{started}) < now() - $1 * interval '1 second'))::bigint, \
         0::float8 \
         FROM {table} AS {al} WHERE {st} = 'processing'{live} GROUP BY 1, 2",
        live = super::and_live(&al, c),
        heartbeat = quote(&c.last_heartbeat_at),
        started = quote(&c.started_at),
    );
    let mut sql = format!("{waiting} UNION ALL {processing}");
    if a.workflows {
        sql.push_str(&format!(
            " UNION ALL SELECT {st}::text, {queue}, count(*)::bigint, 0::bigint, 0::bigint, 0::float8 \
             FROM {table} AS {al} WHERE {st} = 'pending' \
             AND {al}.{id} IN (SELECT \"job_id\" FROM {deps}) GROUP BY 1, 2",
            id = quote(&c.id),
            deps = deps_table(&a.table).quoted(),
        ));
    }
    sql.push_str(" ORDER BY 1, 2");
    Statement {
        sql: sql.into(),
        values: values(vec![Value::from(stalled_age.as_secs_f64())]),
    }
}

/// Finished jobs per state and queue, exactly: `(state, queue, count,
/// failed_recently)`, the last counting the jobs failed in the last `$1`
/// seconds. Cheap only through an index over the final states (the retention
/// index); `Admin::status` runs it only when [`counts_explain`] shows one is used.
/// The HOT layout's retention index is over `finished_at IS NOT NULL` (the
/// state undoes HOT updates), so there the condition names it too: every
/// mark to a final state sets `finished_at`.
pub(crate) fn counts_finished(a: &Table, recent: std::time::Duration) -> Statement {
    let al = quote(&a.table.alias);
    let c = &a.columns;
    let st = format!("{al}.{}", quote(&c.state));
    let finished_at = format!("{al}.{}", quote(&c.finished_at));
    let hot = if c.live {
        format!(" AND {finished_at} IS NOT NULL")
    } else {
        String::new()
    };
    let sql = format!(
        "SELECT {st}::text AS \"state\", {queue} AS \"queue\", count(*)::bigint AS \"count\", \
         (count(*) FILTER (WHERE {st} = 'failed' AND {finished_at} >= now() - $1 * interval '1 second'))::bigint AS \"failed_recently\" \
         FROM {table} AS {al} WHERE {st} IN ({FINISHED}){hot} GROUP BY 1, 2 ORDER BY 1, 2",
        queue = queue_text(a),
        table = a.table.quoted(),
    );
    Statement {
        sql: sql.into(),
        values: values(vec![Value::from(recent.as_secs_f64())]),
    }
}

/// The planner's estimate of the rows in `state`: `EXPLAIN` of a filter on
/// it, read from its JSON plan; nothing is scanned.
pub(crate) fn counts_estimate(a: &Table, state: JobState) -> Statement {
    let al = quote(&a.table.alias);
    Statement {
        sql: format!(
            "EXPLAIN (FORMAT JSON) SELECT 1 FROM {} AS {al} WHERE {al}.{} = '{}'",
            a.table.quoted(),
            quote(&a.columns.state),
            state.as_str()
        )
        .into(),
        values: values(Vec::new()),
    }
}

/// `statement`'s plan as JSON, without running it (same parameters).
pub(crate) fn counts_explain(statement: Statement) -> Statement {
    Statement {
        sql: format!("EXPLAIN (FORMAT JSON) {}", statement.sql).into(),
        values: statement.values,
    }
}

/// For the counts' transaction: the planner takes an index wherever one
/// serves, so a plan with a sequential scan means no index does.
pub(crate) fn counts_avoid_seq_scan() -> Statement {
    Statement {
        sql: "SET LOCAL enable_seqscan = off".into(),
        values: values(Vec::new()),
    }
}

/// A transaction on `pool` whose statements take an index wherever one
/// serves ([`counts_avoid_seq_scan`]): the counts', the history's.
pub(crate) async fn begin_index_only(
    pool: &sqlx::PgPool,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    counts_avoid_seq_scan().execute(&mut *tx).await?;
    Ok(tx)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use std::time::Duration;
    let a = super::fixtures::admin_table();
    let workflows = Table {
        workflows: true,
        ..a.clone()
    };
    let mut hot = a.clone();
    hot.columns.live = true;
    let finished = counts_finished(&a, Duration::from_secs(3600));
    vec![
        ("counts_live", counts_live(&a, Duration::from_secs(30))),
        (
            "counts_live_hot",
            counts_live(&hot, Duration::from_secs(30)),
        ),
        (
            "counts_live_with_workflows",
            counts_live(&workflows, Duration::from_secs(30)),
        ),
        (
            "counts_finished",
            counts_finished(&a, Duration::from_secs(3600)),
        ),
        (
            "counts_finished_hot",
            counts_finished(&hot, Duration::from_secs(3600)),
        ),
        ("counts_estimate", counts_estimate(&a, JobState::Completed)),
        ("counts_explain", counts_explain(finished)),
        ("counts_avoid_seq_scan", counts_avoid_seq_scan()),
    ]
}
