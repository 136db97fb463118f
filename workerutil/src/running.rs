//! What the dequeue loop, the job tasks and the heartbeat loop share: the
//! worker's settings and store, and the set of jobs it is running. Both
//! `worker` and `heartbeat` read it; neither imports the other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use crate::events::WorkerEvent;
use crate::metrics;
use crate::options::WorkerOptions;
use crate::store::{Lease, RecordId};

/// State shared by the dequeue loop, the job tasks and the heartbeat loop.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) name: Arc<str>,
    pub(crate) hostname: String,
    pub(crate) options: WorkerOptions,
    pub(crate) store: Arc<S>,
    pub(crate) running: RunningSet,
    /// The most jobs claimed beyond the free handler slots (resolved from the
    /// options): the fixed allowance, or the adaptive one's bound.
    pub(crate) claim_ahead: usize,
    /// Where an adaptive allowance starts; `None`: fixed at `claim_ahead`.
    pub(crate) adaptive_from: Option<usize>,
    /// Dequeue calls in flight at once while the queue is busy (resolved).
    pub(crate) concurrent_dequeues: usize,
    /// Bounds the finished jobs whose outcome is still being written (four
    /// times the handlers, plus the claim-ahead bound), so slow marks slow the
    /// worker down instead of piling up. Not four times the bound as well: at
    /// the default bound of 1,000 that let 4,000 more finished jobs wait, and
    /// measured 19-22 MiB peak RSS at 64 handlers against 17 MiB, for the same
    /// jobs/s.
    pub(crate) recording: Arc<Semaphore>,
    /// Signaled whenever a job gives its handler slot back (`job_task::Slot`).
    pub(crate) slot_freed: Arc<Notify>,
    /// Outcomes written so far (tells `run_until_empty` whether a mark landed
    /// while a claim ran).
    pub(crate) recorded: std::sync::atomic::AtomicU64,
    events: broadcast::Sender<WorkerEvent>,
}

impl<S> Shared<S> {
    /// The state of a new worker; `options` are validated and `claim_ahead`
    /// and `concurrent_dequeues` resolved against the store by the caller.
    pub(crate) fn new(
        store: Arc<S>,
        options: WorkerOptions,
        hostname: String,
        claim_ahead: usize,
        adaptive_from: Option<usize>,
        concurrent_dequeues: usize,
    ) -> Self {
        let num_handlers = options.num_handlers;
        let (events, _) = broadcast::channel(options.event_capacity);
        Shared {
            name: Arc::from(options.name.as_str()),
            hostname,
            options,
            store,
            running: RunningSet::default(),
            claim_ahead,
            adaptive_from,
            concurrent_dequeues,
            recording: Arc::new(Semaphore::new(
                num_handlers
                    .saturating_mul(4)
                    .saturating_add(claim_ahead)
                    .min(Semaphore::MAX_PERMITS),
            )),
            slot_freed: Arc::new(Notify::new()),
            recorded: std::sync::atomic::AtomicU64::new(0),
            events,
        }
    }

    pub(crate) fn emit(&self, event: WorkerEvent) {
        match &event {
            WorkerEvent::StoreFailed { op, .. } => metrics::store_error(&self.name, op),
            WorkerEvent::HookPanicked { hook, .. } => metrics::hook_panic(&self.name, *hook),
            _ => {}
        }
        // No subscriber is fine: events are for whoever listens.
        let _ = self.events.send(event);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<WorkerEvent> {
        self.events.subscribe()
    }
}

/// A claimed job and its entry in the running set.
pub(crate) struct Claimed<J> {
    pub(crate) job: J,
    pub(crate) running: Running,
}

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

/// Jobs this worker has claimed and not yet recorded, by id. A job whose
/// handler finished stays here, heartbeated, until its outcome is written:
/// a slow mark (a backlog, a grouped UPDATE waiting on a row lock) must not
/// let the store's resetter take a finished job for stalled.
#[derive(Debug, Default)]
pub(crate) struct RunningSet {
    jobs: Mutex<HashMap<RecordId, Entry>>,
}

#[derive(Debug)]
struct Entry {
    running: Running,
    /// The handler is done and the outcome is being written.
    recording: bool,
    /// The store is opening the job: its answer says whether it still owns
    /// it (an open may hand the job back, which a beat meanwhile misses).
    opening: bool,
    /// A beat found the job no longer this worker's while it was being
    /// opened: an open that answers "ours" (one that checks nothing, in
    /// heartbeat handling) must not start it.
    lost_while_opening: bool,
}

impl RunningSet {
    /// Registers a job. A previous entry for the same id belongs to an older,
    /// superseded claim: it is canceled as lost.
    pub(crate) fn insert(&self, running: Running) {
        let entry = Entry {
            running,
            recording: false,
            opening: false,
            lost_while_opening: false,
        };
        let previous = self.lock().insert(entry.running.lease.id, entry);
        if let Some(old) = previous {
            old.running.cancel(CancelReason::Lost);
        }
    }

    /// The handler of `lease` is done: it is still heartbeated, but no longer
    /// counted as running nor canceled as lost (its mark tells).
    pub(crate) fn recording(&self, lease: Lease) {
        if let Some(e) = self.lock().get_mut(&lease.id)
            && e.running.lease == lease
        {
            e.recording = true;
        }
    }

    /// The store starts opening `lease`'s job: until [`opened`](Self::opened),
    /// a beat that misses it does not cancel it (the open may hand it back
    /// and say so) but remembers it.
    pub(crate) fn opening(&self, lease: Lease) {
        if let Some(e) = self.lock().get_mut(&lease.id)
            && e.running.lease == lease
        {
            e.opening = true;
        }
    }

    /// The open of `lease`'s job returned: whether a beat meanwhile found
    /// the job no longer this worker's (then it must not start, whatever
    /// the open said: a claim's token only moves on).
    pub(crate) fn opened(&self, lease: Lease) -> bool {
        match self.lock().get_mut(&lease.id) {
            Some(e) if e.running.lease == lease => {
                e.opening = false;
                std::mem::take(&mut e.lost_while_opening)
            }
            _ => false,
        }
    }

    /// A beat no longer found `lease`'s job: whether to cancel its handler
    /// now. Not one whose handler finished (its mark tells), nor one being
    /// opened (remembered for [`opened`](Self::opened)).
    pub(crate) fn missed_by_beat(&self, lease: Lease) -> bool {
        match self.lock().get_mut(&lease.id) {
            Some(e) if e.running.lease == lease && !e.recording => {
                if e.opening {
                    e.lost_while_opening = true;
                    false
                } else {
                    true
                }
            }
            _ => false,
        }
    }

    /// Removes the entry for `lease`, if it is still the current one.
    pub(crate) fn remove(&self, lease: Lease) {
        let mut jobs = self.lock();
        if jobs
            .get(&lease.id)
            .is_some_and(|e| e.running.lease == lease)
        {
            jobs.remove(&lease.id);
        }
    }

    /// Every lease to heartbeat, those being recorded included.
    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.lock().values().map(|e| e.running.lease).collect()
    }

    /// Jobs claimed and not finished (the running gauge): those being
    /// recorded are not counted.
    pub(crate) fn len(&self) -> usize {
        self.lock().values().filter(|e| !e.recording).count()
    }

    pub(crate) fn cancel_lease(&self, lease: Lease, reason: CancelReason) {
        if let Some(e) = self.lock().get(&lease.id)
            && e.running.lease == lease
        {
            e.running.cancel(reason);
        }
    }

    pub(crate) fn cancel_id(&self, id: RecordId, reason: CancelReason) {
        if let Some(e) = self.lock().get(&id) {
            e.running.cancel(reason);
        }
    }

    pub(crate) fn cancel_all(&self, reason: CancelReason) {
        for e in self.lock().values() {
            e.running.cancel(reason);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Entry>> {
        // A poisoned lock only means a panic happened while holding it; the map is still usable.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}
