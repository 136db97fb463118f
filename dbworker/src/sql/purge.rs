//! Retention: old finished rows deleted or archived in batches.

use super::progress_table::purge_side;
use super::{Statement, Table, alias, col, state, table_ref};
use crate::columns::{HAS_DEPENDENTS, Relation, UPSTREAM_IDS, quote};
use sea_query::{Expr, ExprTrait, LockBehavior, LockType, Order, Query, Value};
use workerutil::JobState;

/// The job history a purge waits for: its table, the job table's name in
/// its `job_table` column, and how far back its passes look (`catch_up`).
#[derive(Debug, Clone)]
pub(crate) struct RecordedBy {
    pub(crate) history: Relation,
    pub(crate) job_table: String,
    pub(crate) catch_up: std::time::Duration,
}

/// `finished_at < <where the history's records end>`: the end of its latest
/// bucket (minute or hour) for the job table. Minutes are recorded in
/// order, so every row finished before it has been counted. A row older than
/// `catch_up` (and a minute, for the history's rounding) goes anyway: no pass
/// of the history records it any more, and a history stopped for good must
/// not keep the table from being purged.
pub(crate) fn recorded(r: &RecordedBy, finished_at: String) -> Expr {
    Expr::cust_with_values(
        format!(
            "{finished_at} < (SELECT GREATEST(max(\"bucket\" + \"seconds\" * interval '1 second'), \
             now() - make_interval(secs => $1::float8) - interval '1 minute') \
             FROM {} WHERE \"job_table\" = $2)",
            r.history.quoted()
        ),
        [
            Value::from(r.catch_up.as_secs_f64()),
            Value::from(r.job_table.clone()),
        ],
    )
}

/// The archive table, and the job table's columns (read at start-up) that
/// archiving copies into it, by name: an archive whose columns are in
/// another order, or that has more, still gets each value in its column.
#[derive(Debug, Clone)]
pub(crate) struct Archive {
    pub(crate) table: Relation,
    pub(crate) columns: Vec<String>,
}

impl Archive {
    /// `INSERT INTO archive (c, …) SELECT c, … FROM source`.
    pub(crate) fn insert_from(&self, source: &str) -> String {
        let list = self
            .columns
            .iter()
            .map(|c| quote(c))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "INSERT INTO {} ({list}) SELECT {list} FROM {source}",
            self.table.quoted()
        )
    }
}

/// Deletes (or moves to the archive table) up to `batch` rows in `state`
/// finished longer than `age` ago, oldest first, skipping locked rows.
/// Returns their ids. With `archive` the rows are moved there (copied by
/// column name). A table with signals loses the
/// purged jobs' mailbox rows in the same statement (they would only grow),
/// a table with the progress side table their side rows. With `history`,
/// only rows it has recorded ([`recorded`]).
pub(crate) fn purge_batch(
    t: &Table,
    archive: Option<&Archive>,
    history: Option<&RecordedBy>,
    state_: JobState,
    age: std::time::Duration,
    batch: u32,
) -> Statement {
    let c = &t.columns;
    let mut doomed = Query::select()
        .column((alias("dbworker_doomed"), alias(&c.id)))
        .from(table_ref(&t.table).alias(alias("dbworker_doomed")))
        .and_where(col("dbworker_doomed", &c.state).eq(state(state_)))
        .and_where(Expr::cust_with_values(
            format!(
                "{}.{} < now() - make_interval(secs => $1::float8)",
                quote("dbworker_doomed"),
                quote(&c.finished_at)
            ),
            [age.as_secs_f64()],
        ))
        .order_by(
            (alias("dbworker_doomed"), alias(&c.finished_at)),
            Order::Asc,
        )
        .limit(u64::from(batch))
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .to_owned();
    if let Some(r) = history {
        doomed.and_where(recorded(
            r,
            format!("{}.{}", quote("dbworker_doomed"), quote(&c.finished_at)),
        ));
    }
    if t.workflows {
        // A job a dependent still waits for (or has yet to run after) stays:
        // the dependent reads its result, and its edge is gone once it
        // completed, so only `upstream_ids` says so. The partial GIN index
        // of `--workflows` serves the check; without it, a scan per such row.
        doomed.and_where(Expr::cust(format!(
            "NOT ({d}.{has} AND EXISTS (SELECT 1 FROM {table} AS \"dbworker_waiting\" \
             WHERE \"dbworker_waiting\".{ups} @> ARRAY[{d}.{id}]::bigint[] \
             AND \"dbworker_waiting\".{state} NOT IN ('completed', 'failed', 'canceled')))",
            d = quote("dbworker_doomed"),
            has = quote(HAS_DEPENDENTS),
            table = t.table.quoted(),
            ups = quote(UPSTREAM_IDS),
            id = quote(&c.id),
            state = quote(&c.state),
        )));
    }
    let a = &t.table.alias;
    let delete = Query::delete()
        .from_table(table_ref(&t.table))
        .and_where(col(a, &c.id).in_subquery(doomed))
        .returning(Query::returning().expr(Expr::cust(match archive {
            Some(_) => format!("{}.*", quote(a)),
            None => format!("{}.{}::bigint AS \"id\"", quote(a), quote(&c.id)),
        })))
        .to_owned();
    let Statement { sql, values } = Statement::from(&delete);
    // The ids come from the deleted rows: `INSERT … RETURNING` would need
    // SELECT on the archive, and a purger is granted only INSERT there.
    let archived = archive.map(|archive| {
        format!(
            ", \"dbworker_archived\" AS ({})",
            archive.insert_from("\"dbworker_moved\"")
        )
    });
    // The moved rows' id: the table's column in an archived row, else `id`.
    let moved_id = if archive.is_some() {
        c.id.as_str()
    } else {
        "id"
    };
    let mail = t.signals.as_ref().map(|mailbox| {
        format!(
            ", \"dbworker_mail\" AS (DELETE FROM {} WHERE \"job_id\" IN (SELECT {}::bigint FROM \"dbworker_moved\"))",
            mailbox.quoted(),
            quote(moved_id)
        )
    });
    // Their progress and checkpoints kept in the side table go too.
    let progress = t
        .progress_table
        .as_ref()
        .map(|side| purge_side(side, moved_id, "dbworker_moved"));
    if archived.is_none() && mail.is_none() && progress.is_none() {
        return Statement { sql, values };
    }
    Statement {
        sql: format!(
            "WITH \"dbworker_moved\" AS ({sql}){}{}{} SELECT {}::bigint AS \"id\" FROM \"dbworker_moved\"",
            archived.unwrap_or_default(),
            mail.unwrap_or_default(),
            progress.unwrap_or_default(),
            quote(moved_id)
        )
        .into(),
        values,
    }
}

/// `SET LOCAL statement_timeout`: a leader's fenced batch holds the lease
/// row, which the leader's own renewal waits for; cut off at `limit` (a third
/// of the lease), a slow batch fails its pass rather than depose the leader.
pub(crate) fn set_statement_timeout(limit: std::time::Duration) -> Statement {
    Statement {
        sql: format!(
            "SET LOCAL statement_timeout = '{}ms'",
            limit.as_millis().max(1)
        )
        .into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// Deletes, among the next `batch` rows of `side` (a table of rows keyed by
/// `key`, each naming a job in `job_id`) past `after` in key order, those
/// whose job no longer exists: a job deleted by plain SQL, or in a dropped
/// partition, leaves its progress or mailbox rows behind. `after` `None`
/// (a new purger) starts at a random key, so that one-off purges started
/// often do not all look at the same first rows. Returns the last key looked
/// at, how many rows were looked at, and how many went. A window per pass,
/// so no pass reads the whole table.
pub(crate) fn sweep_orphans(
    t: &Table,
    side: &Relation,
    key: &str,
    after: Option<i64>,
    batch: u32,
) -> Statement {
    let (key, job) = (quote(key), quote("job_id"));
    let sql = format!(
        "WITH \"dbworker_window\" AS (SELECT {key} AS \"key\", {job} AS \"job\" FROM {side} \
         WHERE {key} > COALESCE($1::bigint, (SELECT floor(random() * max({key}))::bigint FROM {side})) \
         ORDER BY {key} LIMIT $2), \
         \"dbworker_orphans\" AS (DELETE FROM {side} AS \"dbworker_o\" USING \"dbworker_window\" AS \"dbworker_w\" \
         WHERE \"dbworker_o\".{key} = \"dbworker_w\".\"key\" \
         AND NOT EXISTS (SELECT 1 FROM {table} AS \"dbworker_j\" WHERE \"dbworker_j\".{id} = \"dbworker_w\".\"job\") \
         RETURNING 1) \
         SELECT (SELECT max(\"key\") FROM \"dbworker_window\")::bigint AS \"last\", \
         (SELECT count(*) FROM \"dbworker_window\")::bigint AS \"looked\", \
         (SELECT count(*) FROM \"dbworker_orphans\")::bigint AS \"deleted\"",
        side = side.quoted(),
        table = t.table.quoted(),
        id = quote(&t.columns.id),
    );
    Statement {
        sql: sql.into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(vec![
            sea_query::Value::BigInt(after),
            sea_query::Value::BigInt(Some(i64::from(batch))),
        ])),
    }
}

/// Whether row-level security may hide jobs of `t` from the current role
/// (enabled, and neither the role's `BYPASSRLS` nor an owner's exemption
/// applies): the orphan sweep would take a hidden job for a deleted one.
pub(crate) fn row_security_hides_jobs(t: &Table) -> Statement {
    let sql = "SELECT c.relrowsecurity AND NOT r.rolbypassrls \
               AND (c.relforcerowsecurity OR c.relowner <> r.oid) AS \"hides\" \
               FROM pg_class AS c, pg_roles AS r \
               WHERE c.oid = $1::regclass AND r.rolname = current_user";
    Statement {
        sql: sql.into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(vec![sea_query::Value::String(
            Some(t.table.quoted()),
        )])),
    }
}

/// The statement above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{plain, rel};
    let purge = Table::new(rel("app.jobs"), plain());
    let mut signalled = purge.clone();
    signalled.signals = Some(rel("app.jobs_signals"));
    let mut flows = purge.clone();
    flows.workflows = true;
    let mut side = purge.clone();
    side.progress_table = Some(rel("app.jobs_progress"));
    let archive = Archive {
        table: rel("app.jobs_archive"),
        columns: vec!["id".into(), "state".into(), "finished_at".into()],
    };
    let minute = std::time::Duration::from_secs(60);
    vec![
        (
            "purge_batch",
            purge_batch(&purge, None, None, JobState::Completed, minute, 100),
        ),
        (
            "purge_batch_to_archive",
            purge_batch(&purge, Some(&archive), None, JobState::Failed, minute, 100),
        ),
        (
            "purge_batch_with_progress_table",
            purge_batch(&side, None, None, JobState::Completed, minute, 100),
        ),
        (
            "sweep_orphans_progress_table",
            sweep_orphans(&purge, &rel("app.jobs_progress"), "job_id", Some(0), 1000),
        ),
        (
            "sweep_orphans_signals",
            sweep_orphans(&purge, &rel("app.jobs_signals"), "id", None, 1000),
        ),
        ("row_security_hides_jobs", row_security_hides_jobs(&purge)),
        (
            "set_statement_timeout",
            set_statement_timeout(std::time::Duration::from_secs(2)),
        ),
        (
            "purge_batch_with_workflows",
            purge_batch(&flows, None, None, JobState::Completed, minute, 100),
        ),
        (
            "purge_batch_recorded_by_history",
            purge_batch(
                &purge,
                None,
                Some(&super::fixtures::recorded_by()),
                JobState::Completed,
                minute,
                100,
            ),
        ),
        (
            "purge_batch_with_signals",
            purge_batch(&signalled, None, None, JobState::Completed, minute, 100),
        ),
    ]
}
