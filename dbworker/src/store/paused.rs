//! Jobs claimed ahead meet a pause: a job that waited in a worker's buffer
//! while its table or queue was paused goes back to the queue, counting
//! nothing, instead of starting. It is checked right before it opens, and
//! only when a pause may have come since its claim: the store heard of one
//! (a listening store hears each pause made through [`Pauses`](crate::Pauses)),
//! or the job waited at least [`RECHECK_AFTER`] (a polling store hears of
//! none). So the common job, claimed and started within the second, costs
//! no statement. A job already running runs on: a pause stops claims and
//! starts, not work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use workerutil::Record;

use super::{DbJob, DbStore};
use crate::sql;

/// How long a job may wait in the buffer before its start looks for a pause
/// it was not told of.
pub(crate) const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// How many pauses the store has heard of; any may concern its jobs.
#[derive(Debug, Default)]
pub(super) struct PauseWatch {
    heard: AtomicU64,
}

/// What a job's claim saw of its store's pauses.
#[derive(Debug, Clone, Copy)]
pub(super) struct AtClaim {
    heard: u64,
    at: Instant,
}

impl PauseWatch {
    /// A pause was announced (or may have been missed while the listener
    /// was down).
    pub(super) fn heard(&self) {
        self.heard.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn at_claim(&self) -> AtClaim {
        AtClaim {
            heard: self.heard.load(Ordering::SeqCst),
            at: Instant::now(),
        }
    }

    fn may_have_paused(&self, claim: &AtClaim) -> bool {
        self.heard.load(Ordering::SeqCst) != claim.heard || claim.at.elapsed() >= RECHECK_AFTER
    }
}

impl<R: Record> DbStore<R> {
    /// Whether `job` went back to the queue because its table or queue is
    /// paused now. A failed look lets the job start, as it would have
    /// without one.
    pub(super) async fn handed_back_paused(&self, job: &DbJob<R>) -> bool {
        // A store that consults no pause table reads no clock for it.
        if self.options.pause_table.is_none() || !self.pauses_heard.may_have_paused(&job.claimed) {
            return false;
        }
        let lease = job.lease;
        let Some(statement) = sql::requeue_if_paused(&self.options, lease.id, lease.token) else {
            return false;
        };
        match statement.fetch_optional(&self.pool).await {
            Ok(Some(_)) => {
                tracing::info!(store = %self.options.name, record_id = lease.id, "its table or queue was paused while it waited to start: put back in the queue");
                self.back_in_queue(lease.id);
                true
            }
            Ok(None) => false,
            Err(err) => {
                tracing::warn!(store = %self.options.name, record_id = lease.id, error = %err, "could not look for a pause before starting the job; starting it");
                false
            }
        }
    }
}
