//! Samples each table's finished-job counters on a timer, for the charts: the
//! overview never counts the table itself.

use std::sync::Arc;

use tokio_util::sync::{CancellationToken, DropGuard};
use workerutil::JobState;

use super::Shared;

/// Starts sampling; stops when the guard is dropped.
pub(super) fn spawn(shared: Arc<Shared>) -> DropGuard {
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let every = shared.options.sample_interval;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            for t in &shared.tables {
                match t.admin.recent(every).await {
                    Ok(recent) => {
                        let per_second = |state| {
                            let n = recent
                                .iter()
                                .find(|(s, _)| *s == state)
                                .map_or(0, |(_, n)| *n);
                            #[allow(clippy::cast_precision_loss)] // counts far below 2^52
                            let n = n as f64;
                            n / every.as_secs_f64()
                        };
                        let mut samples = t.samples.lock().expect("not poisoned");
                        samples.push_back((
                            per_second(JobState::Completed),
                            per_second(JobState::Failed),
                        ));
                        while samples.len() > shared.options.samples_kept {
                            samples.pop_front();
                        }
                    }
                    Err(err) => {
                        tracing::warn!(table = %t.name, error = %err, "sampling the dashboard counters failed")
                    }
                }
            }
        }
    });
    stop.drop_guard()
}
