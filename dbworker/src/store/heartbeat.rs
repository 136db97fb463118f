//! Heartbeats: one statement refreshes every lease a worker holds and reports
//! which of them were canceled.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

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
        // Progress reported since the last beat rides on this statement, each
        // report numbered as the attempt's next write.
        let progress = self.pending_progress.take(leases);
        let sent: Vec<i64> = progress.iter().map(|(id, _, _)| *id).collect();
        let spans = self.attempt_spans.take(leases);
        // Until the beat returns, its values are on their way; a beat that
        // fails or is abandoned (its timeout) gives them back for the next,
        // numbered anew: if it commits after all, its numbers are below.
        let mut on_the_way = OnTheWay {
            pending: &self.pending_progress,
            sent: &sent,
            wrote: None,
        };
        let rows = sql::heartbeat(&self.options, ids, tokens, progress, spans)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("heartbeat"))?;
        let mut result = HeartbeatResult::default();
        let (mut touched, mut wrote) = (Vec::new(), Vec::new());
        for row in rows {
            let id: i64 = row.get("id");
            result.known.push(id);
            if row.get::<Option<bool>, _>("cancel").unwrap_or(false) {
                result.cancel.push(id);
            }
            if let Ok(Some(true)) = row.try_get::<Option<bool>, _>(sql::HEARTBEAT_TOUCHED) {
                touched.push(id);
            }
            if let Ok(Some(true)) = row.try_get::<Option<bool>, _>(sql::HEARTBEAT_WROTE) {
                wrote.push(id);
            }
        }
        self.attempt_spans.written(leases, &touched);
        // Written: the attempts' final marks need not write them again; a
        // report the beat did not land (the row skipped, locked by its
        // handler, or a newer write landed) goes back.
        on_the_way.wrote = Some(wrote);
        Ok(result)
    }
}

/// The progress a beat carries, told when the beat returns (or is dropped:
/// then nothing is known written).
struct OnTheWay<'a> {
    pending: &'a super::progress::Pending,
    sent: &'a [i64],
    wrote: Option<Vec<i64>>,
}

impl Drop for OnTheWay<'_> {
    fn drop(&mut self) {
        if !self.sent.is_empty() {
            self.pending
                .returned(self.sent, self.wrote.as_deref().unwrap_or_default());
        }
    }
}

/// Each running attempt's span (its `traceparent`) that no heartbeat has
/// recorded in its row yet, by job id, with the attempt's token. A worker
/// killed mid-attempt writes no mark; its first beat has recorded the span,
/// so the attempt after the reset still links to it. Written once per
/// attempt; dropped when written or when the attempt ends ([`Unbeaten`]).
#[derive(Debug, Default)]
pub(super) struct Spans(Mutex<HashMap<i64, (i64, String)>>);

impl Spans {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, (i64, String)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spans of `leases` still to write (kept until written: a beat that
    /// fails or skips the row leaves it to the next).
    fn take(&self, leases: &[Lease]) -> Vec<(i64, String)> {
        let spans = self.lock();
        if spans.is_empty() {
            return Vec::new();
        }
        leases
            .iter()
            .filter_map(|l| match spans.get(&l.id) {
                Some((token, span)) if *token == l.token => Some((l.id, span.clone())),
                _ => None,
            })
            .collect()
    }

    /// The beat over `leases` wrote the spans of the rows `traced`.
    fn written(&self, leases: &[Lease], traced: &[i64]) {
        if traced.is_empty() {
            return;
        }
        let traced: HashSet<i64> = traced.iter().copied().collect();
        let mut spans = self.lock();
        for l in leases.iter().filter(|l| traced.contains(&l.id)) {
            if spans.get(&l.id).is_some_and(|(token, _)| *token == l.token) {
                spans.remove(&l.id);
            }
        }
    }

    fn forget(&self, lease: Lease) {
        let mut spans = self.lock();
        if spans
            .get(&lease.id)
            .is_some_and(|(token, _)| *token == lease.token)
        {
            spans.remove(&lease.id);
        }
    }
}

/// A job's place in the store's [`Spans`] (a table with traces): its
/// attempt's span waits there from the moment it is known until a beat
/// writes it or the job is dropped (its attempt over, marked or not).
#[derive(Debug)]
pub(super) struct Unbeaten {
    spans: Arc<Spans>,
    lease: Lease,
}

impl Unbeaten {
    pub(super) fn new(spans: &Arc<Spans>, lease: Lease) -> Unbeaten {
        Unbeaten {
            spans: spans.clone(),
            lease,
        }
    }

    /// The attempt runs under `span`: the next beat records it.
    pub(super) fn put(&self, span: String) {
        self.spans
            .lock()
            .insert(self.lease.id, (self.lease.token, span));
    }
}

impl Drop for Unbeaten {
    fn drop(&mut self) {
        self.spans.forget(self.lease);
    }
}
