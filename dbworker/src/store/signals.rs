//! Durable waits: the wait mark (the job's row locked first, then the mailbox
//! read, then the mark, in one transaction) and a resumed attempt's fenced
//! consumption of its signal.

use serde::de::DeserializeOwned;
use sqlx::{PgConnection, Row};
use workerutil::{BoxError, Record};

use super::{DbJob, DbStore};
use crate::error::{Error, Result, from_json};
use crate::sql;

impl<R: Record> DbStore<R> {
    /// Ends the attempt waiting for `signal`: in the handler's transaction
    /// (which then commits with what the handler wrote), or in one of its
    /// own. A table without signals snoozes the job for `timeout`.
    pub(super) async fn wait_job(
        &self,
        job: &mut DbJob<R>,
        signal: &str,
        timeout: std::time::Duration,
    ) -> std::result::Result<bool, BoxError> {
        let Some(mailbox) = self.options.signals.clone() else {
            return self.snooze_job(job, timeout).await;
        };
        let lease = job.lease;
        let span = job.attempt_trace.clone();
        let pooled = Some(sql::pool_transaction_mode(&self.pool));
        let mark = async |conn: &mut PgConnection| -> std::result::Result<bool, sqlx::Error> {
            // The row first, as every sender locks it: a sender that came
            // before has committed its signal by now, one that comes after
            // waits for this mark and then finds the job waiting.
            let owned = sql::lock_owned(&self.options, lease.id, lease.token)
                .fetch_optional(sql::On::Conn(&mut *conn, pooled))
                .await?;
            if owned.is_none() {
                return Ok(false);
            }
            // A statement of its own: its snapshot is taken after the lock.
            let sent: bool = sql::signal_sent(&mailbox, lease.id, signal)
                .fetch_one(sql::On::Conn(&mut *conn, pooled))
                .await?
                .get("sent");
            let done = sql::mark_waiting(
                &self.options,
                lease.id,
                lease.token,
                signal,
                timeout,
                sent,
                span.as_deref(),
            )
            .execute(sql::On::Conn(&mut *conn, pooled))
            .await?;
            Ok(done.rows_affected() == 1)
        };
        // The wait ends the attempt as a completion does: a statement or a
        // commit that fails is a failed completion (`store/marks.rs`).
        let failed = async |op, err| {
            self.completion_failed(op, lease, err, span.as_deref())
                .await
        };
        let done = match job.tx.take() {
            // The handler's writes commit with the wait.
            Some(mut tx) => match mark(&mut tx).await {
                Ok(true) => {
                    if let Err(err) = tx.commit().await {
                        return Err(failed("commit", err).await);
                    }
                    true
                }
                Ok(false) => {
                    let _ = tx.rollback().await;
                    false
                }
                Err(err) => {
                    let _ = tx.rollback().await;
                    return Err(failed("mark_waiting", err).await);
                }
            },
            // Its own transaction, holding none of the handler's writes:
            // written again while Postgres rolls it back as passing.
            None => {
                let own = async || -> std::result::Result<bool, sqlx::Error> {
                    let mut tx = self.pool.begin().await?;
                    let done = mark(&mut tx).await?;
                    tx.commit().await?;
                    Ok(done)
                };
                let tried = super::transient::again_if_transient(
                    "a wait",
                    own,
                    super::transient::is_transient,
                )
                .await;
                match tried {
                    Ok(done) => done,
                    Err(err) => return Err(failed("mark_waiting", err).await),
                }
            }
        };
        if done {
            // Behind the claim cursor once it runs again.
            self.back_in_queue(lease.id);
        }
        Ok(done)
    }
}

impl<R: Record> DbJob<R> {
    /// Consumes the signal `name` this job waited for, read as a `T`: the
    /// oldest one not yet consumed, or `None` (it resumed after its timeout,
    /// or never waited). Consumed by this attempt, fenced by its claim: in
    /// transactional handling in the job's transaction, so a failed attempt
    /// leaves it for the next; in heartbeat handling at once. On a table
    /// with traces, the attempt's span gets a link to the sender's span
    /// (the `opentelemetry` feature).
    ///
    /// ```no_run
    /// # use dbworker::{DbJob, DbStore};
    /// # use std::time::Duration;
    /// # use workerutil::HandlerError;
    /// # #[derive(Debug)] struct Job { id: i64 }
    /// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
    /// # async fn handle(job: &mut DbJob<Job>, store: &DbStore<Job>) -> Result<(), HandlerError> {
    /// match job.signal::<serde_json::Value>(store, "payment_confirmed").await? {
    ///     Some(payment) => { /* ship it */ let _ = payment; Ok(()) }
    ///     None => Err(HandlerError::wait_for("payment_confirmed", Duration::from_secs(3600))),
    /// }
    /// # }
    /// ```
    pub async fn signal<T: DeserializeOwned>(
        &mut self,
        store: &DbStore<R>,
        name: &str,
    ) -> Result<Option<T>> {
        let o = store.resolved();
        let Some(mailbox) = &o.signals else {
            return Err(Error::InvalidOption {
                field: "signals",
                reason: "DbJob::signal needs the table's signals (JobTableOptions::signals; `dbworker migration --signals` adds them)".into(),
            });
        };
        let statement = sql::consume_signal(o, mailbox, self.lease.id, self.lease.token, name);
        let row = match self.tx.as_mut() {
            Some(tx) => statement.fetch_optional(tx).await,
            None => statement.fetch_optional(store.pool()).await,
        }
        .map_err(Error::db("consume_signal"))?;
        let Some(row) = row else { return Ok(None) };
        if o.signal_traces
            && let (Some(span), Ok(Some(sender))) = (
                &self.attempt_span,
                row.try_get::<Option<String>, _>(sql::SIGNAL_TRACEPARENT),
            )
        {
            crate::trace::link_sender(span, &sender);
        }
        let payload: Option<serde_json::Value> = row.get("payload");
        from_json(&payload.unwrap_or(serde_json::Value::Null), || {
            format!("the payload of signal {name:?}")
        })
        .map(Some)
    }
}
