//! The heartbeat loop: tells the store the running jobs are alive, and
//! cancels the ones it lost or was asked to cancel.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::error_chain;
use crate::events::WorkerEvent;
use crate::panics::guarded;
use crate::running::{CancelReason, Shared};
use crate::store::Store;

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
                    // A job whose handler finished is not canceled as lost: its
                    // mark may have landed while this beat was in flight (the
                    // beat no longer matches it), and if the job was lost the
                    // mark is refused and says so. Nor one being opened: the
                    // open may have handed it back (withheld), and says so;
                    // if it answers "ours", the miss keeps it from starting.
                    if !result.known.contains(&lease.id) && shared.running.missed_by_beat(*lease) {
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
