//! Wake-ups: how a store tells idle dequeue loops that new work may be waiting
//! (for the Postgres store, a `LISTEN`ing connection), so they need not poll.

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
        }
    }

    /// A new receiver.
    pub fn subscribe(&self) -> Wakeups {
        Wakeups {
            rx: self.tx.subscribe(),
        }
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
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
