//! The enqueue side: typed inserts into the application's own job table, one
//! job or many per statement, inside the caller's transaction or on the pool,
//! with run-at, priority, queue and job keys (dedupe).

mod after;
mod args;
mod check;
mod copy;
mod new_job;
mod partitioned;
mod signals;

use crate::columns::{TRACEPARENT, TRACESTATE};
use crate::trace::TraceContext;
pub(crate) use after::GraphTask;
pub use args::IntoJob;
use copy::{array_text, copy_escape, copy_refused, copy_text, run_at_micros, timestamp_text};
pub use new_job::{DependencyPolicy, KeyMode, NewJob};
pub use signals::Signals;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::metrics::{ENQUEUE_SECONDS, ENQUEUED_TOTAL};
use crate::sql::{self, JobRow, Table};
use crate::table::JobTable;

/// The most characters a job's queue or kind may have.
pub const MAX_NAME_CHARS: usize = 128;
/// The most characters a job's key may have.
pub const MAX_KEY_CHARS: usize = 512;

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new row was inserted (with a replacing [`KeyMode`], also when a
    /// processing job held the key: it gave the key up to the new job).
    Inserted(i64),
    /// A waiting job with the key took the new values ([`KeyMode::Replace`] or
    /// [`KeyMode::PreserveRunAt`]).
    Updated(i64),
    /// A job holds the key and was left as it is ([`KeyMode::DedupeOnly`]: a
    /// live one; [`KeyMode::UnsafeDedupe`]: a live or failed one).
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
/// use dbworker::{Enqueuer, JobTable, JobTableOptions, NewJob};
/// let jobs = JobTable::new(&pool, JobTableOptions::new("email_jobs")).await?;
/// let enqueuer = Enqueuer::new(&pool, &jobs).await?;
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
    target: Arc<Table>,
    /// Whether the grants of [`NewJob::after`] were found: they are checked
    /// at the first enqueue that waits, not at start-up (most never do).
    after_checked: Arc<AtomicBool>,
}

impl Enqueuer {
    /// An enqueuer into `table` (checked when it was built, keys' unique
    /// index included). Checks what only an enqueuer needs: INSERT on the
    /// table (and UPDATE with keys: a keyed enqueue may replace the waiting
    /// holder), USAGE on its id's sequence, on a partitioned table with keys,
    /// SELECT, INSERT and UPDATE on its key table and, with keys and the
    /// progress side table, SELECT and DELETE on that (a replace drops the old work's
    /// checkpoint), naming a missing grant with the statement that gives it.
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Enqueuer> {
        let t = table.sql();
        // A keyed enqueue replaces a waiting holder in place (an UPDATE, or
        // ON CONFLICT DO UPDATE).
        let writes: &[Privilege] = match t.key_column {
            Some(_) => &[Privilege::Insert, Privilege::Update],
            None => &[Privilege::Insert],
        };
        let mut grants = Grants::new("enqueueing")
            .on_table(t, writes)
            .id_sequence(t)
            .on_keys(
                t,
                &[Privilege::Select, Privilege::Insert, Privilege::Update],
            );
        if let (Some(_), Some(side)) = (&t.key_column, &t.progress_table) {
            // A replace deletes the old work's progress and checkpoint.
            grants = grants.on(
                "progress table",
                side,
                &[Privilege::Select, Privilege::Delete],
            );
        }
        grants.check(pool).await?;
        Ok(Enqueuer {
            pool: pool.clone(),
            target: t.clone(),
            after_checked: Arc::default(),
        })
    }

    /// An enqueuer whose grants were not checked (for a reader that never
    /// enqueues).
    #[cfg(feature = "dashboard")]
    pub(crate) fn unchecked(pool: &PgPool, table: &JobTable) -> Enqueuer {
        Enqueuer {
            pool: pool.clone(),
            target: table.sql().clone(),
            after_checked: Arc::default(),
        }
    }

    /// Whether dependents record their upstream jobs (`upstream_ids`).
    pub(crate) fn records_upstreams(&self) -> bool {
        self.target.upstream_ids
    }

    /// The job table.
    pub(crate) fn table(&self) -> &Relation {
        &self.target.table
    }

    /// Counts the jobs one enqueue call inserted, and times it.
    fn observe(&self, how: &'static str, started: Instant, rows: usize) {
        let table = self.target.table.display_name();
        metrics::counter!(ENQUEUED_TOTAL, "table" => table.clone(), "how" => how)
            .increment(rows as u64);
        metrics::histogram!(ENQUEUE_SECONDS, "table" => table, "how" => how)
            .record(started.elapsed().as_secs_f64());
    }

    /// Inserts one job on the enqueuer's pool. With a key, at most one live
    /// job holds it: see [`KeyMode`].
    /// `job` is a [`JobArgs`](crate::JobArgs) value or a [`NewJob`]
    /// ([`IntoJob`]).
    pub fn enqueue(&self, job: impl IntoJob) -> impl Future<Output = Result<Enqueued>> + Send {
        // Converted before the future, which so holds no argument value.
        let job = job.into_job();
        async move {
            let job = job?;
            let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
            self.insert_one(&mut conn, &job).await
        }
    }

    /// Inserts one job on the caller's connection or inside its transaction
    /// (pass `&mut tx` or `&mut *tx`): the job commits with the caller's writes.
    pub fn enqueue_in<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        job: impl IntoJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send + 'a {
        let job = job.into_job();
        async move { self.insert_one(conn, &job?).await }
    }

    /// Inserts `job` (its options checked), without converting it again;
    /// counted and timed.
    pub(crate) async fn insert_one(
        &self,
        conn: &mut PgConnection,
        job: &NewJob,
    ) -> Result<Enqueued> {
        let started = Instant::now();
        let result = self.insert_one_now(conn, job).await;
        self.observe("one", started, result.as_ref().map_or(0, |_| 1));
        result
    }

    /// The current span's trace context, for a job that names none on a
    /// table with traces (read while the caller's span is current).
    fn ambient_trace(&self, job: &NewJob) -> Option<TraceContext> {
        if job.trace_value().is_some() {
            return None;
        }
        self.ambient_context()
    }

    /// The current span's trace context on a table with traces, for every
    /// job of a batch that names none (whatever the first one names).
    pub(crate) fn ambient_context(&self) -> Option<TraceContext> {
        self.target.traces.then(TraceContext::current).flatten()
    }

    async fn insert_one_now(&self, conn: &mut PgConnection, job: &NewJob) -> Result<Enqueued> {
        let traced;
        let job = match self.ambient_trace(job) {
            Some(cx) => {
                traced = job.clone().trace_context(cx);
                &traced
            }
            None => job,
        };
        self.check_job(job)?;
        if !job.after_value().is_empty() {
            return self.enqueue_after(conn, job).await;
        }
        let Some((key, mode)) = job.key_value() else {
            let row = sql::enqueue_rows(&self.target, &[job.row()])
                .fetch_one(&mut *conn)
                .await
                .map_err(Error::db("enqueue"))?;
            return Ok(Enqueued::Inserted(row.get("id")));
        };
        // A live holder of the key may finish between the insert and the
        // look-up; then the key is free and the insert goes through next time.
        let mode: sql::OnKey = mode.into();
        for _ in 0..8 {
            match self.keyed_step(conn, job, key, mode).await? {
                KeyedStep::Done(enqueued) => return Ok(enqueued),
                KeyedStep::Again => continue,
                KeyedStep::HolderRunning => {}
            }
            // The holder is processing: it gives up the key and the new job
            // takes it, in one transaction (a savepoint inside the caller's),
            // so an insert that fails or is dropped leaves the holder its key
            // and its retries. A concurrent enqueuer waits on the holder's
            // row lock, then finds the new job and updates it.
            let mut tx = sqlx::Connection::begin(&mut *conn)
                .await
                .map_err(Error::db("begin"))?;
            sql::release_key(&self.target, key)
                .execute(&mut *tx)
                .await
                .map_err(Error::db("enqueue"))?;
            if let KeyedStep::Done(enqueued) = self.keyed_step(&mut tx, job, key, mode).await? {
                tx.commit().await.map_err(Error::db("commit"))?;
                return Ok(enqueued);
            }
            // Another holder took the key meanwhile: undo the release, look again.
            tx.rollback().await.map_err(Error::db("rollback"))?;
        }
        Err(Error::InvalidOption {
            field: "key",
            reason: format!("the job holding key {key:?} kept changing; try again"),
        })
    }

    /// One try of a keyed insert: the new job inserted, the waiting holder
    /// updated or kept (`Done`), the holder processing (`HolderRunning`,
    /// replacing modes), or the holder gone in between (`Again`).
    async fn keyed_step(
        &self,
        conn: &mut PgConnection,
        job: &NewJob,
        key: &str,
        mode: sql::OnKey,
    ) -> Result<KeyedStep> {
        let row = match &self.target.key_table {
            None => sql::enqueue_keyed(&self.target, &job.row(), key, mode)
                .fetch_optional(&mut *conn)
                .await
                .map_err(Error::db("enqueue"))?,
            Some(keys) => {
                match partitioned::keyed_insert(conn, &self.target, keys, job, key, mode).await? {
                    Some(row) => row,
                    // Another enqueuer inserted a holder first: look again.
                    None => return Ok(KeyedStep::Again),
                }
            }
        };
        if let Some(row) = row {
            let id = row.get("id");
            return Ok(KeyedStep::Done(if row.get::<bool, _>("inserted") {
                Enqueued::Inserted(id)
            } else {
                Enqueued::Updated(id)
            }));
        }
        if mode.replaces() {
            return Ok(KeyedStep::HolderRunning);
        }
        let with_failed = mode == sql::OnKey::UnsafeDedupe;
        let holder = sql::live_job_with_key(&self.target, key, with_failed)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db("enqueue"))?;
        Ok(match holder {
            Some(row) => KeyedStep::Done(Enqueued::Kept(row.get("id"))),
            None => KeyedStep::Again,
        })
    }

    /// Inserts many jobs on the enqueuer's pool, all or none; see
    /// [`enqueue_many_in`](Self::enqueue_many_in).
    pub fn enqueue_many<J: IntoJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<i64>>> + Send {
        let jobs: Result<Vec<NewJob>> = jobs.into_iter().map(IntoJob::into_job).collect();
        async move {
            let jobs = jobs?;
            let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
            self.insert_many(&mut conn, &jobs).await
        }
    }

    /// Inserts many jobs with as few statements as the bind-parameter limit
    /// allows, all or none (in a transaction, or a savepoint inside the
    /// caller's). Returns the new ids in the order of `jobs`. Keyed jobs go
    /// through [`enqueue_in`](Self::enqueue_in), one by one.
    pub fn enqueue_many_in<'a, J: IntoJob>(
        &'a self,
        conn: &'a mut PgConnection,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<i64>>> + Send + 'a {
        let jobs: Result<Vec<NewJob>> = jobs.into_iter().map(IntoJob::into_job).collect();
        async move { self.insert_many(conn, &jobs?).await }
    }

    /// Inserts `jobs`, all or none, without converting them again; counted
    /// and timed.
    pub(crate) async fn insert_many(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        let started = Instant::now();
        let result = self.insert_many_now(conn, jobs).await;
        self.observe("many", started, result.as_ref().map_or(0, Vec::len));
        result
    }

    async fn insert_many_now(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<Vec<i64>> {
        let ambient = self.ambient_context();
        for job in jobs {
            self.check_job(job)?;
            if !job.after_value().is_empty() {
                return Err(Error::InvalidOption {
                    field: "after",
                    reason: "enqueue_many inserts jobs that wait for nothing; use enqueue_in or a workflow".into(),
                });
            }
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
        let per_row = binds_per_row(jobs);
        let rows_per_statement = (MAX_BIND_PARAMETERS / per_row).max(1);
        for chunk in jobs.chunks(rows_per_statement) {
            let rows: Vec<JobRow<'_>> = chunk
                .iter()
                .map(|j| j.row_traced(ambient.as_ref()))
                .collect();
            let rows = sql::enqueue_rows(&self.target, &rows)
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
        let started = Instant::now();
        let result = self.copy_now(conn, jobs).await;
        let rows = result
            .as_ref()
            .map_or(0, |n| usize::try_from(*n).unwrap_or(usize::MAX));
        self.observe("copy", started, rows);
        result
    }

    async fn copy_now(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<u64> {
        let Some(first) = jobs.first() else {
            return Ok(0);
        };
        fn shape(j: &NewJob) -> (Vec<&str>, [bool; 6]) {
            (
                j.columns().collect(),
                [
                    j.priority_value().is_some(),
                    j.queue_value().is_some(),
                    j.max_retries_value().is_some(),
                    j.kind_value().is_some(),
                    j.flags_value().is_some(),
                    j.payload_value().is_some(),
                ],
            )
        }
        for job in jobs {
            self.check_job(job)?;
            if job.key_value().is_some() {
                return Err(copy_refused("keyed jobs need enqueue_in, one by one"));
            }
            if !job.after_value().is_empty() {
                return Err(copy_refused("jobs that wait for others need enqueue_in"));
            }
            if shape(job) != shape(first) {
                return Err(copy_refused(
                    "every job must set the same columns and options (use enqueue_many otherwise)",
                ));
            }
        }
        let t = &self.target;
        let ambient = self.ambient_context();
        let traced = |j: &'_ NewJob| j.trace_value().cloned().or_else(|| ambient.clone());
        let with_traces = t.traces && jobs.iter().any(|j| traced(j).is_some());
        let mut columns: Vec<String> = first.columns().map(str::to_owned).collect();
        columns.push(t.columns.process_after.clone());
        let optional = [
            (first.priority_value().is_some(), &t.priority_column),
            (first.queue_value().is_some(), &t.queue_column),
            (first.max_retries_value().is_some(), &t.max_retries_column),
            (first.kind_value().is_some(), &t.kind_column),
            (first.flags_value().is_some(), &t.flags_column),
            (first.payload_value().is_some(), &t.payload_column),
        ];
        columns.extend(
            optional
                .into_iter()
                .filter(|(set, _)| *set)
                .filter_map(|(_, c)| c.clone()),
        );
        if with_traces {
            columns.extend([TRACEPARENT.to_owned(), TRACESTATE.to_owned()]);
        }
        let mut tx = conn.begin().await.map_err(Error::db("begin"))?;
        let now: i64 = sql::database_now_micros()
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
            if let Some(f) = job.flags_value() {
                fields.push(copy_escape(&array_text(f)));
            }
            if let (Some(column), Some(p)) = (&t.payload_column, job.payload_value()) {
                fields.push(copy_text(column, p)?);
            }
            if with_traces {
                let cx = traced(job);
                let (parent, state) = cx
                    .as_ref()
                    .map_or((None, None), |c| (Some(c.traceparent()), c.tracestate()));
                fields.extend(
                    [parent, state].map(|v| v.map_or_else(|| "\\N".to_owned(), copy_escape)),
                );
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
}

/// What one try of a keyed insert found.
enum KeyedStep {
    Done(Enqueued),
    HolderRunning,
    Again,
}

/// The most values a row of `jobs` binds: its own plus run-at, priority,
/// queue, retry limit, kind, flags, arguments, key and the trace context's
/// two (a statement may bind at most [`MAX_BIND_PARAMETERS`]).
pub(crate) fn binds_per_row(jobs: &[NewJob]) -> usize {
    jobs.iter()
        .map(|j| j.values().len() + 10)
        .max()
        .unwrap_or(1)
}
