//! `workerutil`: a generic background worker with no database in it.
//!
//! A [`Worker`] drives a [`Handler`] over jobs from a [`Store`]: it calls the
//! hooks `pre_dequeue`, `pre_handle`, `handle` and `post_handle`, keeps at most
//! `num_handlers` jobs running, heartbeats them, cancels the ones the store
//! lost or was asked to cancel, enforces a per-job timeout, catches panics, and
//! shuts down gracefully (bounded drain) or immediately.
//!
//! The Postgres store lives in the `dbworker` crate. [`MemoryStore`] is an
//! in-memory store for unit-testing handlers; with the `testing` feature,
//! `conformance` holds the suite every store must pass.
// docs.rs (`[package.metadata.docs.rs]`) labels feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ahead;
mod backoff;
pub mod duration;
mod error;
mod events;
mod execution_log;
mod handler;
mod heartbeat;
mod job_task;
mod memory;
pub mod metrics;
mod options;
mod outcome;
mod panics;
mod registry;
mod retry;
mod running;
mod shutdown;
mod state;
mod store;
mod wakeup;
mod worker;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod conformance;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

// The README's example runs (or compiles) as a doctest (crates.io shows the README).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

pub use tokio_util::sync::CancellationToken;

pub use error::{BoxError, Error, error_chain};
pub use events::{Hook, WorkerEvent};
pub use execution_log::{ExecutionLogEntry, MAX_EXECUTION_LOG_ENTRIES};
pub use handler::{Handler, JobContext};
pub use memory::{JobSnapshot, MemoryConditions, MemoryJob, MemoryStore, MemoryStoreOptions};
pub use options::{DEFAULT_MAX_CLAIM_AHEAD, MIN_INTERVAL, WorkerOptions};
pub use outcome::{HandlerError, Outcome, SharedError};
pub use panics::panic_message;
pub use registry::{KindOptions, KindRegistry};
pub use retry::{Retry, RetryPolicy};
pub use shutdown::ShutdownHandle;
pub use state::{JobState, UnknownState};
pub use store::{
    HeartbeatResult, Job, Lease, Record, RecordId, Store, claim_ahead, concurrent_dequeues,
};
pub use wakeup::{WakeupSender, Wakeups};
pub use worker::{StopReason, Worker, WorkerSummary};
