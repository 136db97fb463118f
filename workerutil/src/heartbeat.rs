//! The running-job set and the heartbeat loop that watches it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::error_chain;
use crate::events::WorkerEvent;
use crate::store::{Lease, RecordId, Store};
use crate::worker::{Shared, guarded};

/// Why a running job's token was fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReason {
    /// The store asked for cancellation.
    Requested,
    /// The store no longer knows the lease.
    Lost,
    /// Heartbeats failed for longer than the limit.
    HeartbeatExpired,
}

/// One running job: its lease and how to stop it.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) lease: Lease,
    pub(crate) token: CancellationToken,
    pub(crate) reason: Arc<OnceLock<CancelReason>>,
}

impl Running {
    pub(crate) fn cancel(&self, reason: CancelReason) {
        // The first reason wins; it is set before the token fires so the task reads it.
        let _ = self.reason.set(reason);
        self.token.cancel();
    }
}

/// Jobs this worker is running, by id.
#[derive(Debug, Default)]
pub(crate) struct RunningSet {
    jobs: Mutex<HashMap<RecordId, Running>>,
}

impl RunningSet {
    /// Registers a job. A previous entry for the same id belongs to an older,
    /// superseded claim: it is canceled as lost.
    pub(crate) fn insert(&self, running: Running) {
        let previous = self.lock().insert(running.lease.id, running);
        if let Some(old) = previous {
            old.cancel(CancelReason::Lost);
        }
    }

    /// Removes the entry for `lease`, if it is still the current one.
    pub(crate) fn remove(&self, lease: Lease) {
        let mut jobs = self.lock();
        if jobs.get(&lease.id).is_some_and(|r| r.lease == lease) {
            jobs.remove(&lease.id);
        }
    }

    /// Whether `lease` is still the current entry for its id.
    pub(crate) fn contains(&self, lease: Lease) -> bool {
        self.lock().get(&lease.id).is_some_and(|r| r.lease == lease)
    }

    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.lock().values().map(|r| r.lease).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn cancel_lease(&self, lease: Lease, reason: CancelReason) {
        if let Some(r) = self.lock().get(&lease.id)
            && r.lease == lease
        {
            r.cancel(reason);
        }
    }

    fn cancel_id(&self, id: RecordId, reason: CancelReason) {
        if let Some(r) = self.lock().get(&id) {
            r.cancel(reason);
        }
    }

    fn cancel_all(&self, reason: CancelReason) {
        for r in self.lock().values() {
            r.cancel(reason);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Running>> {
        // A poisoned lock only means a panic happened while holding it; the map is still usable.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Heartbeats the running jobs every `heartbeat_interval` until `stop` fires.
///
/// A failed heartbeat is logged and retried next round; it never cancels jobs by
/// itself. Only when failures last longer than `heartbeat_failure_limit` are the
/// running jobs canceled, because a resetter may have handed them to someone else.
pub(crate) async fn heartbeat_loop<S: Store>(shared: Arc<Shared<S>>, stop: CancellationToken) {
    let interval = shared.options.heartbeat_interval;
    let limit = shared.options.heartbeat_failure_limit;
    let mut last_success = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let leases = shared.running.leases();
        if leases.is_empty() {
            last_success = Instant::now();
            continue;
        }
        // A heartbeat stuck on the network (or waiting for a connection) counts as
        // failed, so the failure limit bounds how long a cut-off worker runs on.
        let call = guarded("heartbeat", shared.store.heartbeat(&leases));
        let result = match tokio::time::timeout(interval, call).await {
            Ok(result) => result,
            Err(_) => Err(format!("heartbeat took longer than {interval:?}").into()),
        };
        match result {
            Ok(result) => {
                last_success = Instant::now();
                let mut lost = Vec::new();
                for lease in &leases {
                    // A job that finished while the heartbeat was in flight left the
                    // set before its mark: it was not lost, it is done.
                    if !result.known.contains(&lease.id) && shared.running.contains(*lease) {
                        tracing::warn!(worker = %shared.name, record_id = lease.id, "heartbeat lost a job; canceling its handler");
                        shared.running.cancel_lease(*lease, CancelReason::Lost);
                        lost.push(lease.id);
                    }
                }
                for id in &result.cancel {
                    tracing::info!(worker = %shared.name, record_id = id, "cancellation requested");
                    shared.running.cancel_id(*id, CancelReason::Requested);
                }
                shared.emit(WorkerEvent::Heartbeat {
                    lost,
                    canceled: result.cancel,
                });
            }
            Err(err) => {
                let message = error_chain(err.as_ref());
                tracing::warn!(worker = %shared.name, error = %message, "heartbeat failed; will retry");
                shared.emit(WorkerEvent::StoreFailed {
                    op: "heartbeat",
                    message,
                });
                if let Some(limit) = limit
                    && last_success.elapsed() >= limit
                {
                    tracing::error!(worker = %shared.name, limit = ?limit, "heartbeats failing past the limit; canceling running jobs");
                    shared.running.cancel_all(CancelReason::HeartbeatExpired);
                }
            }
        }
    }
}
