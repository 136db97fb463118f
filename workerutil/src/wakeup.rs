//! Wake-ups: how a store tells idle dequeue loops that new work may be waiting
//! (for the Postgres store, a `LISTEN`ing connection), so they need not poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// Bumped on every wake-up; receivers compare it with what they last saw.
    seq: u64,
    /// Whether the source of wake-ups is working right now.
    live: bool,
}

/// The store's side of [`Wakeups`]. Dropping it leaves subscribers polling.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use workerutil::WakeupSender;
/// let sender = WakeupSender::new();
/// let mut wakeups = sender.subscribe();
/// sender.set_live(true);
/// wakeups.mark_seen();
/// sender.wake();
/// wakeups.woken().await; // returns at once: a wake-up arrived since mark_seen
/// assert!(wakeups.is_live());
/// # }
/// ```
#[derive(Debug)]
pub struct WakeupSender {
    tx: watch::Sender<State>,
    /// How many subscribers await a wake-up now.
    waiting: Arc<AtomicUsize>,
}

impl Default for WakeupSender {
    fn default() -> Self {
        WakeupSender::new()
    }
}

impl WakeupSender {
    /// A sender that is not live yet.
    pub fn new() -> Self {
        WakeupSender {
            tx: watch::Sender::new(State::default()),
            waiting: Arc::default(),
        }
    }

    /// A new receiver.
    pub fn subscribe(&self) -> Wakeups {
        Wakeups {
            rx: self.tx.subscribe(),
            waiting: self.waiting.clone(),
        }
    }

    /// Whether a subscriber awaits a wake-up now (an idle worker between
    /// polls): a store need not look for work that nothing announces (jobs
    /// coming due) while none does, since busy workers claim it themselves.
    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// New work may be waiting: wakes every idle subscriber.
    pub fn wake(&self) {
        self.tx.send_modify(|s| s.seq = s.seq.wrapping_add(1));
    }

    /// Records whether wake-ups are flowing. While they are not, workers poll at
    /// their base interval instead of backing off. A change also wakes
    /// subscribers, since wake-ups may have been missed while it was down.
    pub fn set_live(&self, live: bool) {
        self.tx.send_if_modified(|s| {
            let changed = s.live != live;
            if changed {
                s.live = live;
                s.seq = s.seq.wrapping_add(1);
            }
            changed
        });
    }
}

/// A worker's side: wakes the dequeue loop when the store says work may be
/// waiting. Returned by [`Store::wakeups`](crate::Store::wakeups).
#[derive(Debug, Clone)]
pub struct Wakeups {
    rx: watch::Receiver<State>,
    waiting: Arc<AtomicUsize>,
}

/// Counts a subscriber awaiting a wake-up, until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Wakeups {
    /// Whether wake-ups are flowing now (the listener is connected).
    pub fn is_live(&self) -> bool {
        self.rx.borrow().live
    }

    /// Forgets the wake-ups seen so far. Call it before a dequeue, so that one
    /// arriving during the dequeue makes the next [`woken`](Self::woken) return at once.
    pub fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Waits for a wake-up newer than the last one seen. Never returns once the
    /// sender is gone (the worker then relies on polling).
    pub async fn woken(&mut self) {
        let _waiting = Waiting::new(&self.waiting);
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A subscriber counts as waiting while it awaits a wake-up: not once
    /// woken, nor once it stops awaiting (a worker's `select!` took another
    /// branch).
    #[tokio::test]
    async fn a_subscriber_waits_only_while_it_awaits_a_wake_up() {
        let sender = WakeupSender::new();
        let mut wakeups = sender.subscribe();
        assert!(!sender.waiting());
        let task = tokio::spawn(async move {
            wakeups.woken().await;
            wakeups
        });
        for _ in 0..1000 {
            if sender.waiting() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(sender.waiting(), "awaiting a wake-up");
        sender.wake();
        let mut wakeups = task.await.unwrap();
        assert!(!sender.waiting(), "woken");
        let mut pending = Box::pin(wakeups.woken());
        let polled = tokio::time::timeout(Duration::from_millis(10), &mut pending).await;
        assert!(polled.is_err());
        assert!(sender.waiting(), "still awaited");
        drop(pending);
        assert!(!sender.waiting(), "no longer awaited");
    }
}
