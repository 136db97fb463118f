//! Stopping a worker: graceful drain or immediate cancel.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Stops a running [`Worker`](crate::Worker). Cheap to clone.
///
/// - [`graceful`](ShutdownHandle::graceful): stop dequeuing, let running jobs
///   finish within the worker's `drain_timeout`, then cancel the rest (they are
///   put back in the queue).
/// - [`immediate`](ShutdownHandle::immediate): stop dequeuing and cancel every
///   running job now (each is put back in the queue).
///
/// Either way `Worker::run` returns only after every task it started has ended.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    pub(crate) stop_dequeue: CancellationToken,
    pub(crate) cancel_jobs: CancellationToken,
}

impl ShutdownHandle {
    pub(crate) fn new() -> Self {
        ShutdownHandle {
            stop_dequeue: CancellationToken::new(),
            cancel_jobs: CancellationToken::new(),
        }
    }

    /// Stops dequeuing; running jobs get the drain timeout to finish.
    pub fn graceful(&self) {
        self.stop_dequeue.cancel();
    }

    /// Stops dequeuing and cancels every running job now.
    pub fn immediate(&self) {
        self.stop_dequeue.cancel();
        self.cancel_jobs.cancel();
    }

    /// Whether any shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.stop_dequeue.is_cancelled()
    }

    /// Waits until `deadline` (one drain timeout after the shutdown, claims
    /// in flight waited for included) for the jobs `tracker` runs, then
    /// cancels them.
    pub(crate) async fn drain(
        &self,
        tracker: &TaskTracker,
        deadline: Instant,
        worker: &str,
        running: impl Fn() -> usize,
    ) {
        tokio::select! {
            _ = tracker.wait() => {}
            _ = self.cancel_jobs.cancelled() => {}
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(worker, running = running(), "drain timeout reached; canceling running jobs");
                self.cancel_jobs.cancel();
            }
        }
    }
}
