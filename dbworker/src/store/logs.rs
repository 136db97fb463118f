//! Execution logs: entries appended to and updated in the job's row, fenced
//! by the lease, up to the per-attempt cap.

use sqlx::Row;
use workerutil::{BoxError, ExecutionLogEntry, Lease, Record};

use super::DbStore;
use crate::error::Error;
use crate::message::sanitize_log_entry;
use crate::sql;

impl<R: Record> DbStore<R> {
    pub(super) async fn append_log(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<Option<usize>, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let row = sql::log_append(&self.options, lease.id, lease.token, json)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("log_append"))?;
        match row {
            Some(r) => Ok(Some(
                usize::try_from(r.get::<i64, _>("len")).unwrap_or(1) - 1,
            )),
            None => self.log_refused(lease).await,
        }
    }

    pub(super) async fn update_log(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> std::result::Result<bool, BoxError> {
        let json = serde_json::to_string(&sanitize_log_entry(entry))?;
        let done = sql::log_update(&self.options, lease.id, lease.token, index, json)
            .execute(&self.pool)
            .await
            .map_err(Error::db("log_update"))?;
        Ok(done.rows_affected() == 1)
    }

    /// An append matched no row: the lease was lost (`None`), or this attempt's
    /// log is full (an error the handler sees).
    pub(super) async fn log_refused(
        &self,
        lease: Lease,
    ) -> std::result::Result<Option<usize>, BoxError> {
        let owned = sql::log_len(&self.options, lease.id, lease.token)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("log_len"))?;
        let limit = workerutil::MAX_EXECUTION_LOG_ENTRIES;
        match owned.map(|r| r.get::<i64, _>("len")) {
            Some(len) if usize::try_from(len).unwrap_or(0) >= limit => {
                Err(workerutil::Error::ExecutionLogFull {
                    id: lease.id,
                    limit,
                }
                .into())
            }
            _ => Ok(None),
        }
    }
}
