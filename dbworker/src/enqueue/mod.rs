//! The enqueue side: typed inserts into the application's own job table, one
//! job or many per statement, inside the caller's transaction or on the pool,
//! with run-at, priority, queue and job keys (dedupe).

mod after;
mod args;
mod check;
mod copy;
mod new_job;
mod partitioned;

pub(crate) use after::GraphTask;
use copy::{array_text, copy_escape, copy_refused, copy_text, run_at_micros, timestamp_text};
pub use new_job::{DependencyPolicy, KeyMode, NewJob};

use std::collections::HashMap;

use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::columns::{
    BLOCKED_BY, Columns, HAS_DEPENDENTS, Relation, TASK_NAME, UPSTREAM_IDS, WORKFLOW_ID,
    column_name, deps_table,
};
use crate::error::{Error, Result};
use crate::sql::{self, EnqueueTable, JobRow, WorkflowTable};

/// The most characters a job's queue or kind may have.
pub const MAX_NAME_CHARS: usize = 128;
/// The most characters a job's key may have.
pub const MAX_KEY_CHARS: usize = 512;

/// Which table an [`Enqueuer`] writes and which optional columns it has.
///
/// ```
/// let mut options = dbworker::enqueue::EnqueueOptions::new("email_jobs");
/// options.key_column = Some("job_key".into());
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EnqueueOptions {
    /// The job table: `name` or `schema.name` (an alias is accepted and
    /// ignored); double-quoted where SQL needs it: `"\"order\""`.
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
    /// The `text[]` column holding a job's flags (`--flags` adds `flags`).
    /// `None`: [`NewJob::flags`] is refused.
    pub flags_column: Option<String>,
    /// The `jsonb` column typed jobs' arguments go to ([`NewJob::args`];
    /// `--payload` adds `payload`), checked to be `jsonb` by
    /// [`Enqueuer::new`]. Untyped jobs may still set it by name. `None`:
    /// [`NewJob::args`] is refused.
    pub payload_column: Option<String>,
    /// The table has workflows (`dbworker migration --workflows`): jobs may
    /// wait for other jobs ([`NewJob::after`], [`Workflows`](crate::workflow::Workflows)).
    /// `false` (the default): [`NewJob::after`] is refused.
    pub workflows: bool,
    /// With `workflows`: the table must have `upstream_ids` (`dbworker
    /// migration --workflows` or `--results` adds it), where each job that
    /// waits records the jobs it waits for, so its handler can read their
    /// results ([`DbJob::upstream_results`](crate::DbJob::upstream_results)).
    /// `false` (the default): they are recorded all the same when the column
    /// exists (the dashboard draws workflows from it), and not otherwise.
    pub results: bool,
}

impl EnqueueOptions {
    /// Options for `table_name` with the standard column names and no optional column.
    pub fn new(table_name: impl Into<String>) -> Self {
        EnqueueOptions {
            table_name: table_name.into(),
            ..Default::default()
        }
    }

    /// Options for a table with the columns typed jobs need, `kind` and
    /// `payload` (`dbworker migration --typed`): see [`crate::job`].
    ///
    /// ```
    /// let options = dbworker::enqueue::EnqueueOptions::typed("jobs");
    /// assert_eq!(options.payload_column.as_deref(), Some("payload"));
    /// ```
    pub fn typed(table_name: impl Into<String>) -> Self {
        EnqueueOptions {
            kind_column: Some("kind".into()),
            payload_column: Some("payload".into()),
            ..EnqueueOptions::new(table_name)
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
            Some(n) => {
                let n = column_name(field, n)?;
                if columns.expected_types().iter().any(|(_, c, _)| *c == n) {
                    return Err(Error::InvalidOption {
                        field,
                        reason: format!("{n:?} is one of the standard columns"),
                    });
                }
                Ok(Some(n))
            }
            None => Ok(None),
        };
        Ok(EnqueueTable {
            key: optional("key_column", &self.key_column)?,
            queue: optional("queue_column", &self.queue_column)?,
            priority: optional("priority_column", &self.priority_column)?,
            max_retries: optional("max_retries_column", &self.max_retries_column)?,
            kind: optional("kind_column", &self.kind_column)?,
            flags: optional("flags_column", &self.flags_column)?,
            payload: optional("payload_column", &self.payload_column)?,
            key_table: None,
            table,
            columns,
        })
    }

    pub(crate) fn resolve_workflows(&self) -> Result<Option<WorkflowTable>> {
        if !self.workflows {
            return Ok(None);
        }
        Ok(Some(WorkflowTable {
            table: Relation::parse("table_name", &self.table_name)?,
            columns: Columns::resolve(&self.alternate_column_names)?,
        }))
    }
}

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
/// use dbworker::{Enqueuer, NewJob, enqueue::EnqueueOptions};
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
    workflows: Option<WorkflowTable>,
    /// Record each dependent's upstream jobs: the table has `upstream_ids`.
    record_upstreams: bool,
}

impl Enqueuer {
    /// Validates the options and checks the table and the configured columns
    /// (and, with keys, the unique index an enqueue relies on), naming
    /// whatever is missing.
    pub async fn new(pool: &PgPool, options: EnqueueOptions) -> Result<Enqueuer> {
        let mut target = options.resolve()?;
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
        if let Some(column) = &target.payload {
            let hint = "; `dbworker migration --payload` adds it";
            let problem = crate::schema_check::jsonb_column_problem(
                pool,
                &target.table,
                column,
                "payload_column",
                hint,
            )
            .await?;
            crate::schema_check::none(problem.into_iter().collect())?;
        }
        let partitioned = crate::schema_check::is_partitioned(pool, &target.table).await?;
        if partitioned {
            target.key_table = partitioned::check(pool, &target, options.workflows).await?;
        } else if target.key.is_some()
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
        let workflows = options.resolve_workflows()?;
        if let Some(w) = &workflows {
            crate::schema_check::require_columns(
                pool,
                &w.table,
                "table",
                &[WORKFLOW_ID, TASK_NAME, BLOCKED_BY, HAS_DEPENDENTS],
                "or not visible on the search_path",
            )
            .await?;
            crate::schema_check::require_columns(
                pool,
                &deps_table(&w.table),
                "dependency table",
                &["job_id", "depends_on", "policy"],
                "(`dbworker migration --workflows` creates it)",
            )
            .await?;
        }
        // Dependents record their upstream jobs whenever the table has the
        // column (`--workflows` adds it; tables migrated before did not get
        // it, and work as they did); `results` insists on it.
        let record_upstreams = match &workflows {
            Some(w) => {
                let missing = crate::schema_check::missing_columns(
                    pool,
                    &w.table,
                    "table",
                    &[UPSTREAM_IDS],
                    "",
                )
                .await?;
                if options.results && !missing.is_empty() {
                    return Err(Error::Schema {
                        problems: missing
                            .into_iter()
                            .map(|p| format!("{p} (`dbworker migration --workflows` or `--results` adds it; EnqueueOptions::results)"))
                            .collect(),
                    });
                }
                missing.is_empty()
            }
            None => false,
        };
        Ok(Enqueuer {
            pool: pool.clone(),
            target,
            workflows,
            record_upstreams,
        })
    }

    /// Whether dependents record their upstream jobs (`upstream_ids`).
    pub(crate) fn records_upstreams(&self) -> bool {
        self.record_upstreams
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
        if !job.after_value().is_empty() {
            return self.enqueue_after(conn, job).await;
        }
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
        let mode: sql::OnKey = mode.into();
        for _ in 0..8 {
            let row = match &self.target.key_table {
                None => sql::enqueue_keyed(&self.target, &job.row(), key, mode)
                    .query()
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(Error::db("enqueue"))?,
                Some(keys) => {
                    match partitioned::keyed_insert(conn, &self.target, keys, job, key, mode)
                        .await?
                    {
                        Some(row) => row,
                        // Another enqueuer inserted a holder first: look again.
                        None => continue,
                    }
                }
            };
            if let Some(row) = row {
                let id = row.get("id");
                return Ok(if row.get::<bool, _>("inserted") {
                    Enqueued::Inserted(id)
                } else {
                    Enqueued::Updated(id)
                });
            }
            if mode.replaces() {
                // The holder is processing: it gives up the key, and the next
                // insert goes through. A concurrent enqueuer waits on the
                // holder's row lock, then finds the new job and updates it.
                sql::release_key(&self.target, key)
                    .query()
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::db("enqueue"))?;
                continue;
            }
            let with_failed = mode == sql::OnKey::UnsafeDedupe;
            let holder = sql::live_job_with_key(&self.target, key, with_failed)
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
        // Each row binds its values plus run-at, priority, queue, retry limit,
        // kind, flags and arguments at most.
        let per_row = jobs.iter().map(|j| j.values().len() + 7).max().unwrap_or(1);
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
        let mut columns: Vec<String> = first.columns().map(str::to_owned).collect();
        columns.push(t.columns.process_after.clone());
        let optional = [
            (first.priority_value().is_some(), &t.priority),
            (first.queue_value().is_some(), &t.queue),
            (first.max_retries_value().is_some(), &t.max_retries),
            (first.kind_value().is_some(), &t.kind),
            (first.flags_value().is_some(), &t.flags),
            (first.payload_value().is_some(), &t.payload),
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
            if let Some(f) = job.flags_value() {
                fields.push(copy_escape(&array_text(f)));
            }
            if let (Some(column), Some(p)) = (&t.payload, job.payload_value()) {
                fields.push(copy_text(column, p)?);
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
