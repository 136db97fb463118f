//! Events a worker emits, so tests and operators can follow it without sleeping.

use crate::outcome::Outcome;
use crate::store::RecordId;

/// Which hook a [`WorkerEvent::HookPanicked`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `Handler::pre_dequeue`.
    PreDequeue,
    /// `Handler::pre_handle`.
    PreHandle,
    /// `Handler::handle`.
    Handle,
    /// `Handler::post_handle`.
    PostHandle,
}

/// Something that happened in a worker. Subscribe with
/// [`Worker::subscribe`](crate::Worker::subscribe).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// `pre_dequeue` declined to dequeue this round.
    DequeueDeclined,
    /// A dequeue found no eligible job.
    Idle,
    /// A job was dequeued and is about to be handled.
    Dequeued {
        /// The job's id.
        id: RecordId,
    },
    /// A job finished and its outcome was recorded (or refused).
    JobFinished {
        /// The job's id.
        id: RecordId,
        /// What became of it.
        outcome: Outcome,
        /// Whether the store accepted the final mark (false when the job was no
        /// longer owned by this attempt, or the store failed).
        marked: bool,
    },
    /// A claimed job that never started was handed back to the queue (the worker
    /// stopped with it still in its claim-ahead buffer).
    HandedBack {
        /// The job's id.
        id: RecordId,
        /// Whether the store took it back (false: it was no longer ours, or the
        /// store failed and the resetter will requeue it).
        requeued: bool,
    },
    /// A handler ran past `max_runtime_per_job` without yielding to the runtime,
    /// so it could not be stopped in time: it blocks the thread (move blocking
    /// work to `tokio::task::spawn_blocking`).
    Overran {
        /// The job's id.
        id: RecordId,
        /// How long the handler ran.
        ran: std::time::Duration,
    },
    /// A hook panicked; the worker went on.
    HookPanicked {
        /// The hook.
        hook: Hook,
        /// The job, for hooks that have one.
        id: Option<RecordId>,
        /// The panic message.
        message: String,
    },
    /// A store call failed; the worker logged it and went on.
    StoreFailed {
        /// The operation.
        op: &'static str,
        /// The error, rendered.
        message: String,
    },
    /// A heartbeat round succeeded.
    Heartbeat {
        /// Ids the store no longer knew; their handlers were canceled.
        lost: Vec<RecordId>,
        /// Ids asked to cancel; their handlers were canceled.
        canceled: Vec<RecordId>,
    },
    /// The worker stopped dequeuing and is waiting for running jobs.
    Draining,
    /// Every task ended; `run` is about to return.
    Stopped,
}
