//! Helpers for tests that follow a worker through its events instead of
//! sleeping (feature `testing`).

use std::time::Duration;

use tokio::sync::broadcast;

use crate::events::WorkerEvent;
use crate::outcome::Outcome;
use crate::store::RecordId;

/// How long [`wait_for`] waits, on tokio's clock, before it fails the test.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Waits for the first event `pick` accepts and returns what it extracted.
/// Lagged events are skipped. Panics if the worker stops first or nothing
/// matches within [`WAIT_LIMIT`].
pub async fn wait_for<T>(
    events: &mut broadcast::Receiver<WorkerEvent>,
    mut pick: impl FnMut(&WorkerEvent) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("timed out waiting for a worker event");
        match event {
            Ok(event) => {
                if let Some(t) = pick(&event) {
                    return t;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => panic!("worker stopped before the event"),
        }
    }
}

/// A picker for [`wait_for`]: job `id` finished, with its outcome and whether
/// the store accepted the mark.
pub fn finished(id: RecordId) -> impl FnMut(&WorkerEvent) -> Option<(Outcome, bool)> {
    move |event| match event {
        WorkerEvent::JobFinished {
            id: got,
            outcome,
            marked,
        } if *got == id => Some((outcome.clone(), *marked)),
        _ => None,
    }
}
