//! One reset pass over a job table: stalled (and orphaned) processing rows
//! requeued, or failed past their reset budget, in one statement. The
//! `Resetter` runs it periodically; `DbStore::reset_stalled` runs it once.

use std::time::Duration;

use sqlx::{PgConnection, Row};
use workerutil::{JobState, RecordId};

use crate::columns::{Columns, Relation};
use crate::error::{Error, Result};
use crate::sql;

#[derive(Debug, Clone)]
pub(crate) struct ResetConfig {
    pub(crate) table: Relation,
    pub(crate) columns: Columns,
    pub(crate) stalled_max_age: Duration,
    pub(crate) max_num_resets: u32,
    pub(crate) message: String,
    pub(crate) dead_nodes: Option<(Relation, Duration)>,
    /// The error history resets append to, if kept.
    pub(crate) error_history: Option<sql::ErrorHistory>,
}

/// What one resetter pass did.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ResetOutcome {
    /// Jobs put back in the queue, with how old their heartbeat was.
    pub reset: Vec<(RecordId, Duration)>,
    /// Jobs failed because they were reset too often.
    pub failed: Vec<RecordId>,
}

pub(crate) async fn reset_pass(conn: &mut PgConnection, cfg: &ResetConfig) -> Result<ResetOutcome> {
    let rows = sql::reset_stalled(
        &cfg.table,
        &cfg.columns,
        cfg.stalled_max_age.as_secs_f64(),
        cfg.dead_nodes.as_ref(),
        cfg.max_num_resets,
        &cfg.message,
        cfg.error_history.as_ref(),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("reset_stalled"))?;
    if let Some((nodes, dead_after)) = &cfg.dead_nodes {
        // By then the heartbeat rule has reset anything the rescue missed.
        sql::nodes_prune(nodes, *dead_after + cfg.stalled_max_age)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("nodes_prune"))?;
    }
    let mut out = ResetOutcome::default();
    for row in rows {
        let id: i64 = row.get("id");
        if row.get::<String, _>("state") == JobState::Queued.as_str() {
            let age = Duration::from_secs_f64(row.get::<f64, _>("age").max(0.0));
            out.reset.push((id, age));
        } else {
            out.failed.push(id);
        }
    }
    out.reset.sort_by_key(|(id, _)| *id);
    out.failed.sort_unstable();
    Ok(out)
}
