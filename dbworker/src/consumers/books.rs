//! A `LogStore`'s books in this process: per consumer, the slice running now,
//! when it may start the next one, its failures in a row, and (with a
//! dispatcher) what the database last said about it, so a consumer that is
//! caught up is not asked about again until the log's head moves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::consumers::slice::LogPoint;

/// Per consumer, in this process.
#[derive(Debug, Default)]
struct ConsumerState {
    /// The slice running now, by its number in this process.
    in_flight: Option<u64>,
    not_before: Option<Instant>,
    failures: u32,
    /// The last answer of the database about this consumer.
    checked: Option<Checked>,
}

/// What the database said about a consumer, and when.
#[derive(Debug, Clone, Copy)]
struct Checked {
    at: Instant,
    /// `Some(checkpoint)`: held here, with no event after the checkpoint.
    /// `None`: not held by this process.
    caught_up_to: Option<LogPoint>,
}

/// When consumers are asked about again, with a dispatcher.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recheck {
    /// A consumer not held here: asked again after this (the leader may have
    /// assigned it since).
    pub(crate) unheld: Duration,
    /// Any consumer: asked again after this whatever the head says (a
    /// checkpoint moved by hand).
    pub(crate) always: Duration,
}

/// The books; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Books {
    state: Arc<Mutex<HashMap<String, ConsumerState>>>,
    slices: AtomicU64,
}

impl Books {
    /// The consumers among `consumers` that may start a slice now.
    pub(crate) fn ready(&self, consumers: &[String]) -> Vec<String> {
        let now = Instant::now();
        let state = self.state.lock().expect("not poisoned");
        consumers
            .iter()
            .filter(|c| {
                state
                    .get(*c)
                    .is_none_or(|s| s.in_flight.is_none() && s.not_before.is_none_or(|t| t <= now))
            })
            .cloned()
            .collect()
    }

    /// Of `ready`, those worth asking the database about given the log's
    /// `head`: never checked, behind the head, or due for a recheck. Without a
    /// head (none read yet, or the read failed) all of them.
    pub(crate) fn behind(
        &self,
        ready: Vec<String>,
        head: Option<LogPoint>,
        recheck: Recheck,
    ) -> Vec<String> {
        let Some(head) = head else {
            return ready;
        };
        let now = Instant::now();
        let state = self.state.lock().expect("not poisoned");
        ready
            .into_iter()
            .filter(|c| {
                let Some(checked) = state.get(c).and_then(|s| s.checked) else {
                    return true;
                };
                let age = now.saturating_duration_since(checked.at);
                age >= recheck.always
                    || match checked.caught_up_to {
                        Some(point) => point < head,
                        None => age >= recheck.unheld,
                    }
            })
            .collect()
    }

    /// Records what the database said: held and caught up to `caught_up_to`,
    /// or (`None`) not held here.
    pub(crate) fn checked(&self, consumer: &str, caught_up_to: Option<LogPoint>) {
        let mut state = self.state.lock().expect("not poisoned");
        state.entry(consumer.to_owned()).or_default().checked = Some(Checked {
            at: Instant::now(),
            caught_up_to,
        });
    }

    /// Forgets what the database said: the consumer is asked about again.
    pub(crate) fn forget(&self, consumer: &str) {
        let mut state = self.state.lock().expect("not poisoned");
        if let Some(s) = state.get_mut(consumer) {
            s.checked = None;
        }
    }

    /// Marks a slice of `consumer` in flight; the slot frees it when dropped.
    pub(crate) fn start(&self, consumer: &str) -> Slot {
        let slice = self.slices.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().expect("not poisoned");
        state.entry(consumer.to_owned()).or_default().in_flight = Some(slice);
        Slot {
            state: self.state.clone(),
            consumer: consumer.to_owned(),
            slice,
        }
    }

    /// Ends a slice: on success the consumer pauses `pause` and is known to
    /// be at `advanced_to`; on failure it waits `retry_after`. Returns the
    /// failures in a row.
    pub(crate) fn settle(
        &self,
        consumer: &str,
        outcome: std::result::Result<LogPoint, ()>,
        pause: Duration,
        retry_after: Duration,
    ) -> u32 {
        let mut state = self.state.lock().expect("not poisoned");
        let s = state.entry(consumer.to_owned()).or_default();
        s.in_flight = None;
        match outcome {
            Ok(advanced_to) => {
                s.failures = 0;
                s.not_before = Some(Instant::now() + pause);
                s.checked = Some(Checked {
                    at: Instant::now(),
                    caught_up_to: Some(advanced_to),
                });
            }
            Err(()) => {
                s.failures += 1;
                s.not_before = Some(Instant::now() + retry_after);
            }
        }
        s.failures
    }
}

/// A consumer's in-flight mark in the process's books, for one slice.
#[derive(Debug)]
pub(crate) struct Slot {
    state: Arc<Mutex<HashMap<String, ConsumerState>>>,
    consumer: String,
    slice: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.state.lock().expect("not poisoned");
        if let Some(s) = state.get_mut(&self.consumer)
            && s.in_flight == Some(self.slice)
        {
            s.in_flight = None;
        }
    }
}
