//! Fair tables: a job that was not due when it started to wait (scheduled, a
//! retry's backoff, a snooze) waits untagged, behind every tagged job of its
//! level, since the head it would be tagged against will have moved on by
//! the time it is due. Once due, whichever worker claims first has it tagged
//! against the head of that moment, about once a second.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use crate::sql::{self, Table};

/// How often a store has the jobs come due tagged: how long one may wait
/// behind the tagged jobs once due.
const EVERY: Duration = Duration::from_secs(1);

/// The most jobs tagged in one statement (earliest due first); the rest
/// wait for the next pass.
const AT_MOST: u64 = 1000;

/// When this store last had the jobs come due tagged.
#[derive(Debug, Default)]
pub(super) struct ComeDue {
    last: Mutex<Option<Instant>>,
}

impl ComeDue {
    /// Has the untagged jobs of `t` that came due tagged, if `t` is fair with
    /// the tagging trigger for them and a second has passed since the last
    /// time. A failure is logged: those jobs still run, behind the tagged.
    pub(super) async fn tag(&self, pool: &PgPool, t: &Table) {
        if !t.fair_due {
            return;
        }
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        match sql::tag_come_due(t, AT_MOST).execute(pool).await {
            Ok(done) if done.rows_affected() > 0 => {
                tracing::debug!(tagged = done.rows_affected(), "fair: jobs come due tagged");
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "fair: tagging the jobs come due failed; they run after the tagged ones until the next try");
            }
        }
    }
}
