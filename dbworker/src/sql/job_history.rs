//! The job history (`dbworker::history`): finished jobs per job table, queue
//! and minute, aggregated from the job table through the index over
//! `finished_at` (the retention index), downsampled to hours, purged after a
//! while, and read back for the charts and `dbworker top`.
//!
//! Raw text where sea-query has no words for it: ordered-set aggregates
//! (`percentile_cont(...) WITHIN GROUP`), `FILTER`, a data-modifying CTE
//! feeding an `INSERT ... ON CONFLICT DO UPDATE`. Every identifier is quoted,
//! every value bound. Buckets are cut on the epoch (`floor(epoch / seconds)`),
//! so they do not depend on the session's time zone.

use sea_query::Value;
use sea_query_sqlx::SqlxValues;

use super::{Statement, Table};
use crate::columns::{Relation, quote};

/// The final states, exactly as the retention index's predicate lists them,
/// so the planner can prove it applies.
const FINISHED: &str = "'completed', 'failed', 'canceled'";

/// A minute row's width, and an hour row's.
const MINUTE: i64 = 60;
pub(crate) const HOUR: i64 = 3600;

/// The columns a history row holds after its key, in the order every
/// statement below writes them.
const MEASURES: &str = "\"completed\", \"failed\", \"canceled\", \"retried\", \"timed\", \
     \"wait_p50\", \"wait_p95\", \"wait_max\", \"wait_sum\", \
     \"run_p50\", \"run_p95\", \"run_max\", \"run_sum\"";

fn values(v: Vec<Value>) -> SqlxValues {
    SqlxValues(sea_query::Values(v))
}

/// `expr` (a timestamptz) rounded down to a multiple of `seconds` since the
/// epoch, as a timestamptz.
fn floor_to(expr: &str, seconds: &str) -> String {
    format!("to_timestamp(floor(EXTRACT(EPOCH FROM {expr}) / {seconds}) * {seconds})")
}

/// The range the next aggregation covers, as epoch seconds `(lo, hi)`: from
/// the end of the newest minute already recorded for job table `$1` (or
/// `$3` seconds back, whichever is later) to the start of the minute that
/// was current `$2` seconds ago, so only closed minutes whose late commits
/// have settled are aggregated. `lo >= hi`: nothing to do.
pub(crate) fn history_bounds(
    h: &Relation,
    job_table: &str,
    settle: std::time::Duration,
    catch_up: std::time::Duration,
) -> Statement {
    let closed = floor_to("now() - $2 * interval '1 second'", "60");
    let back = floor_to("now() - $3 * interval '1 second'", "60");
    let sql = format!(
        "SELECT EXTRACT(EPOCH FROM GREATEST(\
         (SELECT max(\"bucket\") + interval '1 minute' FROM {h} WHERE \"job_table\" = $1 AND \"seconds\" = {MINUTE}), \
         {back}))::bigint AS \"lo\", EXTRACT(EPOCH FROM {closed})::bigint AS \"hi\"",
        h = h.quoted(),
    );
    Statement {
        sql: sql.into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(settle.as_secs_f64()),
            Value::from(catch_up.as_secs_f64()),
        ]),
    }
}

/// One row per queue and minute of the jobs of `a` finished in `[$2, $3)`
/// (epoch seconds), inserted unless that row exists: a closed minute gives
/// every process the same row, so whichever inserts it first wins and none
/// is counted twice. `retried`: the attempts that errored and were retried,
/// counted in the minute their job finished (the job table keeps only a job's
/// last state): every failure of a completed or canceled job, all but the
/// last of a failed one (that last failure was final, not retried). Wait: from due (`queued_at`, or a later `process_after`: a
/// run-at or a retry) to the last start; run: from the last start to the
/// finish; over the jobs whose last attempt ran to their end (one put back
/// to wait and ended while waiting has neither). Returns the rows inserted.
pub(crate) fn history_record(
    a: &Table,
    h: &Relation,
    job_table: &str,
    lo: i64,
    hi: i64,
) -> Statement {
    let al = quote(&a.table.alias);
    let c = &a.columns;
    let col = |name: &str| format!("{al}.{}", quote(name));
    let (state, finished, started) = (col(&c.state), col(&c.finished_at), col(&c.started_at));
    let queue = match &a.queue_column {
        Some(q) => format!("COALESCE({}::text, '')", col(q)),
        None => "''".to_owned(),
    };
    let wait = format!(
        "GREATEST(EXTRACT(EPOCH FROM {started} - GREATEST({queued}, COALESCE({after}, {queued}))), 0)::float8",
        queued = col(&c.queued_at),
        after = col(&c.process_after),
    );
    let run = format!("GREATEST(EXTRACT(EPOCH FROM {finished} - {started}), 0)::float8");
    // The job ended in the attempt that last started: a claim needs
    // `process_after <= now()` and sets `started_at = now()`, so a later
    // `process_after` means the job was put back to wait (a retry, a snooze)
    // and ended without running again (canceled or failed while waiting).
    let ran = format!(
        "({started} IS NOT NULL AND ({after} IS NULL OR {after} <= {started}))",
        after = col(&c.process_after),
    );
    let failures = format!("COALESCE({}, 0)", col(&c.num_failures));
    let sql = format!(
        "INSERT INTO {h} (\"job_table\", \"queue\", \"bucket\", \"seconds\", {MEASURES}) \
         SELECT $1, {queue}, {bucket}, {MINUTE}, \
         count(*) FILTER (WHERE {state} = 'completed'), \
         count(*) FILTER (WHERE {state} = 'failed'), \
         count(*) FILTER (WHERE {state} = 'canceled'), \
         COALESCE(sum(CASE WHEN {state} = 'failed' THEN GREATEST({failures} - 1, 0) ELSE {failures} END), 0), \
         count(\"x\".\"wait\"), \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY \"x\".\"wait\"), \
         percentile_cont(0.95) WITHIN GROUP (ORDER BY \"x\".\"wait\"), \
         max(\"x\".\"wait\"), COALESCE(sum(\"x\".\"wait\"), 0), \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY \"x\".\"run\"), \
         percentile_cont(0.95) WITHIN GROUP (ORDER BY \"x\".\"run\"), \
         max(\"x\".\"run\"), COALESCE(sum(\"x\".\"run\"), 0) \
         FROM {table} AS {al} CROSS JOIN LATERAL (SELECT \
         CASE WHEN {ran} THEN {wait} END AS \"wait\", \
         CASE WHEN {ran} THEN {run} END AS \"run\") AS \"x\" \
         WHERE {state} IN ({FINISHED}) AND {finished} >= to_timestamp($2) AND {finished} < to_timestamp($3) \
         GROUP BY 2, 3 \
         ON CONFLICT (\"job_table\", \"queue\", \"bucket\", \"seconds\") DO NOTHING",
        h = h.quoted(),
        table = a.table.quoted(),
        bucket = floor_to(&finished, "60"),
    );
    Statement {
        sql: sql.into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(lo),
            Value::from(hi),
        ]),
    }
}

/// The weighted mean of `column` over rows weighted by `"timed"`, from
/// `from` (a relation alias or none).
fn weighted(column: &str, from: &str) -> String {
    format!(
        "sum({from}\"{column}\" * {from}\"timed\") FILTER (WHERE {from}\"{column}\" IS NOT NULL) \
         / NULLIF(sum({from}\"timed\") FILTER (WHERE {from}\"{column}\" IS NOT NULL), 0)"
    )
}

/// Turns the minute rows of job table `$1` from hours that ended more than
/// `$2` seconds ago into one hour row per queue: counts, sums and maxima
/// exact, the percentiles the minutes' weighted by their timed jobs (an
/// approximation). Deleted and inserted in one statement, added to an hour
/// row that exists, so processes doing it at once move each minute once.
/// Returns the hour rows written.
pub(crate) fn history_downsample(
    h: &Relation,
    job_table: &str,
    older_than: std::time::Duration,
) -> Statement {
    let merged_mean = |column: &str| {
        format!(
            "\"{column}\" = (COALESCE(\"h\".\"{column}\" * \"h\".\"timed\", 0) + COALESCE(\"excluded\".\"{column}\" * \"excluded\".\"timed\", 0)) \
             / NULLIF(CASE WHEN \"h\".\"{column}\" IS NULL THEN 0 ELSE \"h\".\"timed\" END + CASE WHEN \"excluded\".\"{column}\" IS NULL THEN 0 ELSE \"excluded\".\"timed\" END, 0)"
        )
    };
    let added =
        |column: &str| format!("\"{column}\" = \"h\".\"{column}\" + \"excluded\".\"{column}\"");
    let greater = |column: &str| {
        format!("\"{column}\" = GREATEST(\"h\".\"{column}\", \"excluded\".\"{column}\")")
    };
    let sets = [
        added("completed"),
        added("failed"),
        added("canceled"),
        added("retried"),
        merged_mean("wait_p50"),
        merged_mean("wait_p95"),
        greater("wait_max"),
        added("wait_sum"),
        merged_mean("run_p50"),
        merged_mean("run_p95"),
        greater("run_max"),
        added("run_sum"),
        // Last: every expression above reads the row's value before the update.
        added("timed"),
    ]
    .join(", ");
    let sql = format!(
        "WITH \"gone\" AS (DELETE FROM {h} WHERE \"job_table\" = $1 AND \"seconds\" = {MINUTE} \
         AND \"bucket\" < {cutoff} RETURNING *) \
         INSERT INTO {h} AS \"h\" (\"job_table\", \"queue\", \"bucket\", \"seconds\", {MEASURES}) \
         SELECT \"job_table\", \"queue\", {hour}, {HOUR}, \
         sum(\"completed\"), sum(\"failed\"), sum(\"canceled\"), sum(\"retried\"), sum(\"timed\"), \
         {wait_p50}, {wait_p95}, max(\"wait_max\"), sum(\"wait_sum\"), \
         {run_p50}, {run_p95}, max(\"run_max\"), sum(\"run_sum\") \
         FROM \"gone\" GROUP BY 1, 2, 3 \
         ON CONFLICT (\"job_table\", \"queue\", \"bucket\", \"seconds\") DO UPDATE SET {sets}",
        h = h.quoted(),
        cutoff = floor_to("now() - $2 * interval '1 second'", "3600"),
        hour = floor_to("\"bucket\"", "3600"),
        wait_p50 = weighted("wait_p50", ""),
        wait_p95 = weighted("wait_p95", ""),
        run_p50 = weighted("run_p50", ""),
        run_p95 = weighted("run_p95", ""),
    );
    Statement {
        sql: sql.into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(older_than.as_secs_f64()),
        ]),
    }
}

/// Deletes job table `$1`'s rows whose bucket started more than `$2`
/// seconds ago.
pub(crate) fn history_purge(h: &Relation, job_table: &str, keep: std::time::Duration) -> Statement {
    Statement {
        sql: format!(
            "DELETE FROM {} WHERE \"job_table\" = $1 AND \"bucket\" < now() - $2 * interval '1 second'",
            h.quoted()
        )
        .into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(keep.as_secs_f64()),
        ]),
    }
}

/// The database clock (epoch seconds) and whether the history table exists.
pub(crate) fn history_clock(h: &Relation) -> Statement {
    Statement {
        sql: "SELECT EXTRACT(EPOCH FROM now())::float8 AS \"now\", to_regclass($1) IS NOT NULL AS \"exists\""
            .into(),
        values: values(vec![Value::from(h.quoted())]),
    }
}

/// What the readers sum per group: counts, then the weighted percentiles
/// and maxima of wait and run.
fn read_measures() -> String {
    format!(
        "sum(\"completed\")::bigint AS \"completed\", sum(\"failed\")::bigint AS \"failed\", \
         sum(\"canceled\")::bigint AS \"canceled\", sum(\"retried\")::bigint AS \"retried\", \
         sum(\"timed\")::bigint AS \"timed\", \
         ({})::float8 AS \"wait_p50\", ({})::float8 AS \"wait_p95\", max(\"wait_max\")::float8 AS \"wait_max\", \
         ({})::float8 AS \"run_p50\", ({})::float8 AS \"run_p95\", max(\"run_max\")::float8 AS \"run_max\"",
        weighted("wait_p50", ""),
        weighted("wait_p95", ""),
        weighted("run_p50", ""),
        weighted("run_p95", ""),
    )
}

/// Job table `$1`'s history from `$2` (epoch seconds) on, in steps of `$3`
/// seconds (`"at"`: each step's start, epoch seconds), every queue together.
pub(crate) fn history_series(h: &Relation, job_table: &str, from: i64, step: i64) -> Statement {
    Statement {
        sql: format!(
            "SELECT (floor(EXTRACT(EPOCH FROM \"bucket\") / $3) * $3)::bigint AS \"at\", {} \
             FROM {} WHERE \"job_table\" = $1 AND \"bucket\" >= to_timestamp($2) GROUP BY 1 ORDER BY 1",
            read_measures(),
            h.quoted()
        )
        .into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(from),
            Value::from(step),
        ]),
    }
}

/// Job table `$1`'s history from `$2` (epoch seconds) on, per queue.
pub(crate) fn history_by_queue(h: &Relation, job_table: &str, from: i64) -> Statement {
    Statement {
        sql: format!(
            "SELECT \"queue\", {} FROM {} WHERE \"job_table\" = $1 AND \"bucket\" >= to_timestamp($2) \
             GROUP BY 1 ORDER BY 1",
            read_measures(),
            h.quoted()
        )
        .into(),
        values: values(vec![
            Value::from(job_table.to_owned()),
            Value::from(from),
        ]),
    }
}

/// Job table `$1`'s finished jobs per queue over every row the history
/// keeps, and how far back it reaches (`"covered"`: seconds from the oldest
/// bucket to now, database clock).
pub(crate) fn history_finished(h: &Relation, job_table: &str) -> Statement {
    Statement {
        sql: format!(
            "SELECT \"queue\", sum(\"completed\")::bigint AS \"completed\", \
             sum(\"failed\")::bigint AS \"failed\", sum(\"canceled\")::bigint AS \"canceled\", \
             EXTRACT(EPOCH FROM now() - min(\"bucket\"))::float8 AS \"covered\" \
             FROM {} WHERE \"job_table\" = $1 GROUP BY 1 ORDER BY 1",
            h.quoted()
        )
        .into(),
        values: values(vec![Value::from(job_table.to_owned())]),
    }
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use std::time::Duration;
    let a = super::fixtures::admin_table();
    let h = super::fixtures::rel("dbworker_history");
    let key = "example_jobs";
    vec![
        (
            "history_bounds",
            history_bounds(
                &h,
                key,
                Duration::from_secs(60),
                Duration::from_secs(6 * 3600),
            ),
        ),
        ("history_record", history_record(&a, &h, key, 0, 3600)),
        (
            "history_downsample",
            history_downsample(&h, key, Duration::from_secs(86_400)),
        ),
        (
            "history_purge",
            history_purge(&h, key, Duration::from_secs(14 * 86_400)),
        ),
        ("history_clock", history_clock(&h)),
        ("history_series", history_series(&h, key, 0, 60)),
        ("history_by_queue", history_by_queue(&h, key, 0)),
        ("history_finished", history_finished(&h, key)),
    ]
}
