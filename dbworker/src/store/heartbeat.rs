//! Heartbeats: one statement refreshes every lease a worker holds and reports
//! which of them were canceled.

use sqlx::Row;
use workerutil::{BoxError, HeartbeatResult, Lease, Record};

use super::DbStore;
use crate::error::Error;
use crate::sql;

impl<R: Record> DbStore<R> {
    pub(super) async fn heartbeat_jobs(
        &self,
        leases: &[Lease],
    ) -> std::result::Result<HeartbeatResult, BoxError> {
        let ids = leases.iter().map(|l| l.id).collect();
        let tokens = leases.iter().map(|l| l.token).collect();
        // Progress reported since the last beat rides on this statement.
        let progress = self.pending_progress.take(leases);
        let rows = sql::heartbeat(&self.options, ids, tokens, progress)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("heartbeat"))?;
        let mut result = HeartbeatResult::default();
        for row in rows {
            let id: i64 = row.get("id");
            result.known.push(id);
            if row.get::<Option<bool>, _>("cancel").unwrap_or(false) {
                result.cancel.push(id);
            }
        }
        Ok(result)
    }
}
