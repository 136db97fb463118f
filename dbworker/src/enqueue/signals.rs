//! [`Signals`]: sending a job the signal it waits for, from Rust, on the pool
//! or inside the sender's own transaction.

use sqlx::{PgConnection, PgPool, Row};

use crate::error::{Error, Result};
use crate::sql::{self, SignalTarget};
use crate::table::JobTable;
use crate::trace::TraceContext;

/// Sends signals to a table's jobs (`dbworker migration --signals`). A
/// signal is durable (one sent before the job waits is kept, and the job's
/// wait then ends at once), delivered once (a repeated `dedupe` key is
/// dropped for that job, so a webhook retried three times delivers once; by
/// key, a retry that arrives after the key passed to a new job is that
/// job's signal), and consumed by the attempt it resumes
/// ([`DbJob::signal`](crate::DbJob::signal)). A signal to a finished job is
/// kept too: it is read only if the job runs again (an operator's requeue).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, order_job: i64) -> Result<(), Box<dyn std::error::Error>> {
/// use dbworker::{JobTable, JobTableOptions, Signals};
/// let jobs = JobTable::new(&pool, JobTableOptions::detected("jobs")).await?;
/// let signals = Signals::new(&pool, &jobs).await?;
/// // In the webhook's own transaction: its write and the signal commit together.
/// let mut tx = pool.begin().await?;
/// // ... record the payment in tx ...
/// let new = signals
///     .send_in(&mut tx, order_job, "payment_confirmed", serde_json::json!({"amount": 42}), Some("evt_123"))
///     .await?;
/// tx.commit().await?;
/// # let _ = new; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Signals {
    pool: PgPool,
    table: JobTable,
}

impl Signals {
    /// Signals for `table`'s jobs; the table must have signals
    /// ([`JobTable::has_signals`]), and `pool`'s role the grants sending
    /// uses (as [`Admin::check_signals`](crate::admin::Admin::check_signals)
    /// checks: `SELECT, UPDATE` on the table, `SELECT, INSERT` on its
    /// mailbox, `USAGE` on the mailbox's id sequence), each missing one
    /// named in one [`Error::Access`].
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Signals> {
        if !table.has_signals() {
            return Err(Error::InvalidOption {
                field: "signals",
                reason: format!(
                    "table {} has no signals (`dbworker migration --signals` adds them)",
                    table.name()
                ),
            });
        }
        crate::grants::Grants::signal_sender(table.sql())
            .check(pool)
            .await?;
        Ok(Signals {
            pool: pool.clone(),
            table: table.clone(),
        })
    }

    /// Sends `name` with `payload` to job `job_id` on the pool; returns
    /// whether it is new (`false`: `dedupe` was sent before). An unknown job
    /// is an error.
    pub async fn send(
        &self,
        job_id: i64,
        name: &str,
        payload: serde_json::Value,
        dedupe: Option<&str>,
    ) -> Result<bool> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.send_in(&mut conn, job_id, name, payload, dedupe).await
    }

    /// [`send`](Self::send) on the caller's connection or inside its
    /// transaction: the signal is delivered if, and when, it commits.
    pub async fn send_in(
        &self,
        conn: &mut PgConnection,
        job_id: i64,
        name: &str,
        payload: serde_json::Value,
        dedupe: Option<&str>,
    ) -> Result<bool> {
        self.deliver(conn, SignalTarget::Id(job_id), name, payload, dedupe)
            .await
    }

    /// [`send`](Self::send) to the live job holding `key` (a keyed table;
    /// the key column must be `job_key`, which `<table>_signal_key` reads).
    pub async fn send_to_key(
        &self,
        key: &str,
        name: &str,
        payload: serde_json::Value,
        dedupe: Option<&str>,
    ) -> Result<bool> {
        // The function reads `job_key`; a table keyed by another column
        // would be told "no such job" for every key.
        if let Some(column) = self.table.sql().key_column.as_deref()
            && column != "job_key"
        {
            return Err(Error::InvalidOption {
                field: "key_column",
                reason: format!(
                    "a signal by key finds the job by its job_key column (`<table>_signal_key`), but {} keys its jobs by {column}",
                    self.table.relation().display_name(),
                ),
            });
        }
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.deliver(&mut conn, SignalTarget::Key(key), name, payload, dedupe)
            .await
    }

    async fn deliver(
        &self,
        conn: &mut PgConnection,
        to: SignalTarget<'_>,
        name: &str,
        payload: serde_json::Value,
        dedupe: Option<&str>,
    ) -> Result<bool> {
        let payload = (!payload.is_null()).then_some(payload);
        // The sender's span, for the attempt that consumes the signal.
        let trace = self
            .table
            .sql()
            .signal_traces
            .then(TraceContext::current)
            .flatten();
        let trace = trace.as_ref().map(TraceContext::traceparent);
        let row = sql::send_signal(self.table.relation(), to, (name, payload), dedupe, trace)
            .fetch_one(conn)
            .await
            .map_err(Error::db("send_signal"))?;
        Ok(row.get::<Option<bool>, _>("sent").unwrap_or(false))
    }
}
