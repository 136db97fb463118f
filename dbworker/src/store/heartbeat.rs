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
        // Progress reported since the last beat rides on this statement; a
        // value whose beat fails is written by its attempt's final mark.
        let progress = self.pending_progress.take(leases);
        let sent: Vec<i64> = progress.iter().map(|(id, _)| *id).collect();
        let rows = sql::heartbeat(&self.options, ids, tokens, progress)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("heartbeat"))?;
        // Written: the attempts' final marks need not write them again.
        self.pending_progress.written(&sent);
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
