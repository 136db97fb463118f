//! The enqueue side: typed inserts into the application's own job table, one
//! job or many per statement, inside the caller's transaction or on the pool,
//! with run-at, priority, queue and job keys (dedupe).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use sea_query::Value;
use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::columns::{Columns, Relation, is_identifier};
use crate::error::{Error, Result};
use crate::sql::{self, EnqueueTable, JobRow, OnKey, RunAt};

/// Which table an [`Enqueuer`] writes and which optional columns it has.
///
/// ```
/// let mut options = dbworker::EnqueueOptions::new("email_jobs");
/// options.key_column = Some("job_key".into());
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EnqueueOptions {
    /// The job table: `name` or `schema.name` (an alias is accepted and ignored).
    pub table_name: String,
    /// Standard columns renamed in this table, `standard → actual`, as in
    /// `StoreOptions::alternate_column_names`.
    pub alternate_column_names: HashMap<String, String>,
    /// The column holding job keys (`dbworker migration --keys` adds `job_key`
    /// and its unique index). `None`: [`NewJob::key`] is refused.
    pub key_column: Option<String>,
    /// The column naming a job's queue (`--queue` adds `queue`). `None`:
    /// [`NewJob::queue`] is refused.
    pub queue_column: Option<String>,
    /// The integer column the store's `order_by` ranks by (`--priority` adds
    /// `priority` and an index for `order_by = "j.priority DESC, j.id"`).
    /// `None`: [`NewJob::priority`] is refused.
    pub priority_column: Option<String>,
    /// The integer column with a per-job retry limit (`--max-retries` adds
    /// `max_retries`; the store reads it through `StoreOptions::max_retries_column`).
    /// `None`: [`NewJob::max_retries`] is refused.
    pub max_retries_column: Option<String>,
    /// The column naming a job's kind (`--kind` adds `kind`). `None`:
    /// [`NewJob::kind`] is refused.
    pub kind_column: Option<String>,
}

impl EnqueueOptions {
    /// Options for `table_name` with the standard column names and no optional column.
    pub fn new(table_name: impl Into<String>) -> Self {
        EnqueueOptions {
            table_name: table_name.into(),
            ..Default::default()
        }
    }

    /// Checks every name; the error names the field.
    pub fn validate(&self) -> Result<()> {
        self.resolve().map(|_| ())
    }

    pub(crate) fn resolve(&self) -> Result<EnqueueTable> {
        let table = Relation::parse("table_name", &self.table_name)?;
        let columns = Columns::resolve(&self.alternate_column_names)?;
        let optional = |field: &'static str, name: &Option<String>| match name {
            Some(n) if !is_identifier(n) => Err(Error::InvalidOption {
                field,
                reason: format!("{n:?} is not a plain identifier of at most 63 bytes"),
            }),
            Some(n)
                if columns
                    .expected_types()
                    .iter()
                    .any(|(_, c, _)| *c == n.as_str()) =>
            {
                Err(Error::InvalidOption {
                    field,
                    reason: format!("{n:?} is one of the standard columns"),
                })
            }
            other => Ok(other.clone()),
        };
        Ok(EnqueueTable {
            key: optional("key_column", &self.key_column)?,
            queue: optional("queue_column", &self.queue_column)?,
            priority: optional("priority_column", &self.priority_column)?,
            max_retries: optional("max_retries_column", &self.max_retries_column)?,
            kind: optional("kind_column", &self.kind_column)?,
            table,
            columns,
        })
    }
}

/// What to do when a live job (queued, errored or processing) already holds
/// the new job's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyMode {
    /// A waiting job with the key takes the new job's columns and run-at.
    #[default]
    Replace,
    /// A waiting job with the key takes the new job's columns but keeps its run-at.
    PreserveRunAt,
    /// Nothing changes if a live job holds the key.
    DedupeOnly,
}

impl From<KeyMode> for OnKey {
    fn from(mode: KeyMode) -> OnKey {
        match mode {
            KeyMode::Replace => OnKey::Replace,
            KeyMode::PreserveRunAt => OnKey::PreserveRunAt,
            KeyMode::DedupeOnly => OnKey::DedupeOnly,
        }
    }
}

/// A job to enqueue: the application's column values plus scheduling options.
///
/// ```
/// use std::time::Duration;
/// let job = dbworker::NewJob::new()
///     .json("payload", serde_json::json!({"to": "a@example.com"}))
///     .set("attempt_limit", 3_i32)
///     .run_after(Duration::from_secs(60));
/// assert_eq!(job.columns().count(), 2);
/// ```
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    values: Vec<(String, Value)>,
    run_at: Option<RunAt>,
    priority: Option<i32>,
    queue: Option<String>,
    max_retries: Option<u32>,
    kind: Option<String>,
    key: Option<(String, KeyMode)>,
}

impl NewJob {
    /// A job with no column set: every column takes its default.
    pub fn new() -> Self {
        NewJob::default()
    }

    /// Sets one of the application's columns (bound, never formatted into SQL).
    pub fn set(mut self, column: impl Into<String>, value: impl Into<Value>) -> Self {
        let column = column.into();
        self.values.retain(|(c, _)| *c != column);
        self.values.push((column, value.into()));
        self
    }

    /// Sets a `json` or `jsonb` column.
    pub fn json(self, column: impl Into<String>, value: serde_json::Value) -> Self {
        self.set(column, Value::Json(Some(Box::new(value))))
    }

    /// Runs no earlier than `at` (stored in `process_after`).
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(RunAt::At(at));
        self
    }

    /// Runs no earlier than `delay` after the enqueue, by the database clock.
    pub fn run_after(mut self, delay: Duration) -> Self {
        self.run_at = Some(RunAt::After(delay));
        self
    }

    /// Sets the priority column (needs `EnqueueOptions::priority_column`).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets the queue column (needs `EnqueueOptions::queue_column`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Sets the job's kind (needs `EnqueueOptions::kind_column`): which handler
    /// of a [`KindRegistry`](workerutil::KindRegistry) runs it.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Overrides the store's `max_num_retries` for this job (needs
    /// `EnqueueOptions::max_retries_column`, and the store's
    /// `StoreOptions::max_retries_column` to honour it).
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// Gives the job a key: at most one live job holds a key at a time
    /// (needs `EnqueueOptions::key_column`); `mode` says what happens when one
    /// already does. A processing job is never changed.
    pub fn key(mut self, key: impl Into<String>, mode: KeyMode) -> Self {
        self.key = Some((key.into(), mode));
        self
    }

    /// The application columns set so far.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|(c, _)| c.as_str())
    }

    /// The job as the enqueue statements take it.
    pub(crate) fn row(&self) -> JobRow<'_> {
        JobRow {
            values: &self.values,
            run_at: self.run_at,
            priority: self.priority,
            queue: self.queue.as_deref(),
            max_retries: self.max_retries,
            kind: self.kind.as_deref(),
        }
    }

    pub(crate) fn values(&self) -> &[(String, Value)] {
        &self.values
    }

    pub(crate) fn run_at_value(&self) -> Option<RunAt> {
        self.run_at
    }

    pub(crate) fn priority_value(&self) -> Option<i32> {
        self.priority
    }

    pub(crate) fn queue_value(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    pub(crate) fn kind_value(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    pub(crate) fn max_retries_value(&self) -> Option<u32> {
        self.max_retries
    }

    pub(crate) fn key_value(&self) -> Option<(&str, KeyMode)> {
        self.key.as_ref().map(|(k, m)| (k.as_str(), *m))
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new row was inserted.
    Inserted(i64),
    /// A waiting job with the key took the new values ([`KeyMode::Replace`] or
    /// [`KeyMode::PreserveRunAt`]).
    Updated(i64),
    /// A live job holds the key and was left as it is: [`KeyMode::DedupeOnly`],
    /// or the job holding it is processing.
    Kept(i64),
}

impl Enqueued {
    /// The id of the job that now carries the work.
    pub fn id(&self) -> i64 {
        match *self {
            Enqueued::Inserted(id) | Enqueued::Updated(id) | Enqueued::Kept(id) => id,
        }
    }
}

/// Bind parameters Postgres accepts in one statement.
const MAX_BIND_PARAMETERS: usize = 65_535;

/// Inserts jobs into an application's job table.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::{EnqueueOptions, Enqueuer, NewJob};
/// let enqueuer = Enqueuer::new(&pool, EnqueueOptions::new("email_jobs")).await?;
/// let job = NewJob::new().json("payload", serde_json::json!({"to": "a@example.com"}));
/// // On the enqueuer's pool:
/// let id = enqueuer.enqueue(&job).await?.id();
/// // Or in the caller's transaction: committed (and announced to LISTENing
/// // workers) with it, gone if it rolls back.
/// let mut tx = pool.begin().await.unwrap();
/// enqueuer.enqueue_in(&mut tx, &job).await?;
/// tx.commit().await.unwrap();
/// # let _ = id; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Enqueuer {
    pool: PgPool,
    target: EnqueueTable,
}

impl Enqueuer {
    /// Validates the options and checks the table and the configured columns
    /// (and, with keys, the unique index an enqueue relies on), naming
    /// whatever is missing.
    pub async fn new(pool: &PgPool, options: EnqueueOptions) -> Result<Enqueuer> {
        let target = options.resolve()?;
        let c = &target.columns;
        let needed: Vec<&str> = [c.id.as_str(), c.state.as_str(), c.process_after.as_str()]
            .into_iter()
            .chain(target.optional_columns())
            .collect();
        crate::schema_check::require_columns(
            pool,
            &target.table,
            "table",
            &needed,
            "or not visible on the search_path",
        )
        .await?;
        if target.key.is_some()
            && let Err(err) = sql::explain_keyed_insert(&target)
                .query()
                .execute(pool)
                .await
        {
            return Err(Error::Schema {
                problems: vec![format!(
                    "the key column needs a unique index on it WHERE its state is queued, errored or processing (`dbworker migration --keys` prints it): {err}"
                )],
            });
        }
        Ok(Enqueuer {
            pool: pool.clone(),
            target,
        })
    }

    /// The job table.
    pub(crate) fn table(&self) -> &Relation {
        &self.target.table
    }

    /// Inserts one job on the enqueuer's pool. With a key, at most one live
    /// job holds it: see [`KeyMode`].
    pub async fn enqueue(&self, job: &NewJob) -> Result<Enqueued> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.enqueue_in(&mut conn, job).await
    }

    /// Inserts one job on the caller's connection or inside its transaction
    /// (pass `&mut tx` or `&mut *tx`): the job commits with the caller's writes.
    pub async fn enqueue_in(&self, conn: &mut PgConnection, job: &NewJob) -> Result<Enqueued> {
        self.check_job(job)?;
        let Some((key, mode)) = job.key_value() else {
            let row = sql::enqueue_rows(&self.target, &[job.row()])
                .query()
                .fetch_one(&mut *conn)
                .await
                .map_err(Error::db("enqueue"))?;
            return Ok(Enqueued::Inserted(row.get("id")));
        };
        // A live holder of the key may finish between the insert and the
        // look-up; then the key is free and the insert goes through next time.
        for _ in 0..8 {
            let row = sql::enqueue_keyed(&self.target, &job.row(), key, mode.into())
                .query()
                .fetch_optional(&mut *conn)
                .await
                .map_err(Error::db("enqueue"))?;
            if let Some(row) = row {
                let id = row.get("id");
                return Ok(if row.get::<bool, _>("inserted") {
                    Enqueued::Inserted(id)
                } else {
                    Enqueued::Updated(id)
                });
            }
            let holder = sql::live_job_with_key(&self.target, key)
                .query()
                .fetch_optional(&mut *conn)
                .await
                .map_err(Error::db("enqueue"))?;
            if let Some(row) = holder {
                return Ok(Enqueued::Kept(row.get("id")));
            }
        }
        Err(Error::InvalidOption {
            field: "key",
            reason: format!("the job holding key {key:?} kept changing; try again"),
        })
    }

    /// Inserts many jobs on the enqueuer's pool, all or none; see
    /// [`enqueue_many_in`](Self::enqueue_many_in).
    pub async fn enqueue_many(&self, jobs: &[NewJob]) -> Result<Vec<i64>> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.enqueue_many_in(&mut conn, jobs).await
    }

    /// Inserts many jobs with as few statements as the bind-parameter limit
    /// allows, all or none (in a transaction, or a savepoint inside the
    /// caller's). Returns the new ids in the order of `jobs`. Keyed jobs go
    /// through [`enqueue_in`](Self::enqueue_in), one by one.
    pub async fn enqueue_many_in(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        for job in jobs {
            self.check_job(job)?;
            if job.key_value().is_some() {
                return Err(Error::InvalidOption {
                    field: "key",
                    reason: "enqueue_many inserts unkeyed jobs; enqueue keyed ones one by one"
                        .into(),
                });
            }
        }
        let mut tx = conn.begin().await.map_err(Error::db("begin"))?;
        let mut ids = Vec::with_capacity(jobs.len());
        // Each row binds its values plus run-at, priority, queue, retry limit and kind at most.
        let per_row = jobs.iter().map(|j| j.values().len() + 5).max().unwrap_or(1);
        let rows_per_statement = (MAX_BIND_PARAMETERS / per_row).max(1);
        for chunk in jobs.chunks(rows_per_statement) {
            let rows: Vec<JobRow<'_>> = chunk.iter().map(NewJob::row).collect();
            let rows = sql::enqueue_rows(&self.target, &rows)
                .query()
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db("enqueue_many"))?;
            ids.extend(rows.iter().map(|r| r.get::<i64, _>("id")));
        }
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(ids)
    }

    /// Loads many jobs with `COPY … FROM STDIN` on the enqueuer's pool, all or
    /// none; see [`enqueue_copy_in`](Self::enqueue_copy_in).
    pub async fn enqueue_copy(&self, jobs: &[NewJob]) -> Result<u64> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.enqueue_copy_in(&mut conn, jobs).await
    }

    /// Loads many jobs with `COPY … FROM STDIN` (the fastest bulk path; no ids
    /// come back), all or none (in a transaction, or a savepoint inside the
    /// caller's). Returns how many rows were loaded.
    ///
    /// COPY cannot ask for a column's default row by row, so every job must set
    /// the same columns and options (run-at aside: a job without one runs at
    /// once). `run_after` delays count from the database clock, read once.
    /// Values must be scalars (booleans, numbers, text, JSON); keyed jobs go
    /// through [`enqueue_in`](Self::enqueue_in).
    pub async fn enqueue_copy_in(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<u64> {
        let Some(first) = jobs.first() else {
            return Ok(0);
        };
        fn shape(j: &NewJob) -> (Vec<&str>, [bool; 4]) {
            (
                j.columns().collect(),
                [
                    j.priority_value().is_some(),
                    j.queue_value().is_some(),
                    j.max_retries_value().is_some(),
                    j.kind_value().is_some(),
                ],
            )
        }
        for job in jobs {
            self.check_job(job)?;
            if job.key_value().is_some() {
                return Err(copy_refused("keyed jobs need enqueue_in, one by one"));
            }
            if shape(job) != shape(first) {
                return Err(copy_refused(
                    "every job must set the same columns and options (use enqueue_many otherwise)",
                ));
            }
        }
        let t = &self.target;
        let mut columns: Vec<String> = first.columns().map(str::to_owned).collect();
        columns.push(t.columns.process_after.clone());
        let optional = [
            (first.priority_value().is_some(), &t.priority),
            (first.queue_value().is_some(), &t.queue),
            (first.max_retries_value().is_some(), &t.max_retries),
            (first.kind_value().is_some(), &t.kind),
        ];
        columns.extend(
            optional
                .into_iter()
                .filter(|(set, _)| *set)
                .filter_map(|(_, c)| c.clone()),
        );
        let mut tx = conn.begin().await.map_err(Error::db("begin"))?;
        let now: i64 = sql::database_now_micros()
            .query()
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("enqueue_copy"))?
            .get("now");
        let mut data = String::new();
        for job in jobs {
            let mut fields: Vec<String> = job
                .values()
                .iter()
                .map(|(column, v)| copy_text(column, v))
                .collect::<Result<_>>()?;
            fields.push(match job.run_at_value() {
                None => "\\N".to_owned(),
                Some(run_at) => timestamp_text(run_at_micros(run_at, now)),
            });
            if let Some(p) = job.priority_value() {
                fields.push(p.to_string());
            }
            if let Some(q) = job.queue_value() {
                fields.push(copy_escape(q));
            }
            if let Some(m) = job.max_retries_value() {
                fields.push(m.to_string());
            }
            if let Some(k) = job.kind_value() {
                fields.push(copy_escape(k));
            }
            data.push_str(&fields.join("\t"));
            data.push('\n');
        }
        let mut copy = tx
            .copy_in_raw(&sql::copy_in(t, &columns))
            .await
            .map_err(Error::db("enqueue_copy"))?;
        copy.send(data.into_bytes())
            .await
            .map_err(Error::db("enqueue_copy"))?;
        let rows = copy.finish().await.map_err(Error::db("enqueue_copy"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(rows)
    }

    /// Refuses options this table was not configured for.
    fn check_job(&self, job: &NewJob) -> Result<()> {
        let t = &self.target;
        let refuse = |field: &'static str, what: &str| {
            Err(Error::InvalidOption {
                field,
                reason: format!("the job sets a {what}, but EnqueueOptions::{field} is not set"),
            })
        };
        if job.key_value().is_some() && t.key.is_none() {
            return refuse("key_column", "key");
        }
        if job.queue_value().is_some() && t.queue.is_none() {
            return refuse("queue_column", "queue");
        }
        if job.priority_value().is_some() && t.priority.is_none() {
            return refuse("priority_column", "priority");
        }
        if job.max_retries_value().is_some() && t.max_retries.is_none() {
            return refuse("max_retries_column", "retry limit");
        }
        if job.kind_value().is_some() && t.kind.is_none() {
            return refuse("kind_column", "kind");
        }
        for (column, _) in job.values() {
            if !is_identifier(column) {
                return Err(Error::InvalidOption {
                    field: "column",
                    reason: format!("{column:?} is not a plain identifier"),
                });
            }
            let standard = t
                .columns
                .expected_types()
                .iter()
                .any(|(_, c, _)| *c == column.as_str());
            let optional = t.optional_columns().any(|c| c == column);
            if standard || optional {
                return Err(Error::InvalidOption {
                    field: "column",
                    reason: format!(
                        "{column:?} is managed by dbworker; use the NewJob option for it"
                    ),
                });
            }
        }
        Ok(())
    }
}

fn copy_refused(reason: &str) -> Error {
    Error::InvalidOption {
        field: "enqueue_copy",
        reason: reason.to_owned(),
    }
}

/// Escapes text for COPY's text format: backslash, tab, newline, carriage return.
fn copy_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// A value in COPY's text format (`\N` for NULL).
fn copy_text(column: &str, value: &Value) -> Result<String> {
    fn or_null<T>(v: &Option<T>, f: impl FnOnce(&T) -> String) -> String {
        v.as_ref().map_or_else(|| "\\N".to_owned(), f)
    }
    Ok(match value {
        Value::Bool(v) => or_null(v, |b| if *b { "t" } else { "f" }.to_owned()),
        Value::TinyInt(v) => or_null(v, ToString::to_string),
        Value::SmallInt(v) => or_null(v, ToString::to_string),
        Value::Int(v) => or_null(v, ToString::to_string),
        Value::BigInt(v) => or_null(v, ToString::to_string),
        Value::TinyUnsigned(v) => or_null(v, ToString::to_string),
        Value::SmallUnsigned(v) => or_null(v, ToString::to_string),
        Value::Unsigned(v) => or_null(v, ToString::to_string),
        Value::BigUnsigned(v) => or_null(v, ToString::to_string),
        Value::Float(v) => or_null(v, ToString::to_string),
        Value::Double(v) => or_null(v, ToString::to_string),
        Value::String(v) => or_null(v, |s| copy_escape(s)),
        Value::Char(v) => or_null(v, |c| copy_escape(&c.to_string())),
        Value::Json(v) => or_null(v, |j| copy_escape(&j.to_string())),
        _ => {
            return Err(copy_refused(&format!(
                "column {column:?}: COPY takes booleans, numbers, text and JSON; use enqueue_many for other values"
            )));
        }
    })
}

/// A run-at as microseconds since the epoch, delays counted from `now` (the
/// database clock).
fn run_at_micros(run_at: RunAt, now: i64) -> i64 {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match run_at {
        RunAt::After(delay) => now.saturating_add(micros(delay)),
        RunAt::At(at) => match at.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => micros(d),
            Err(before) => -micros(before.duration()),
        },
    }
}

/// `YYYY-MM-DD HH:MM:SS.ffffff+00` for microseconds since the epoch (UTC).
fn timestamp_text(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{frac:06}+00",
        in_day / 3_600,
        in_day % 3_600 / 60,
        in_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_in_utc_for_copy() {
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00.000000+00");
        assert_eq!(
            timestamp_text(951_827_696_789_012),
            "2000-02-29 12:34:56.789012+00"
        );
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999999+00");
    }

    #[test]
    fn copy_text_escapes_what_copy_would_read_as_syntax() {
        let v = Value::String(Some("a\tb\nc\\d".into()));
        assert_eq!(copy_text("c", &v).unwrap(), "a\\tb\\nc\\\\d");
        assert_eq!(copy_text("c", &Value::Int(None)).unwrap(), "\\N");
        assert_eq!(copy_text("c", &Value::Bool(Some(true))).unwrap(), "t");
    }
}
