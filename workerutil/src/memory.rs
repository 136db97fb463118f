//! An in-memory `Store`, for unit-testing handlers without a database.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

use crate::error::{BoxError, Error};
use crate::execution_log::{ExecutionLogEntry, MAX_EXECUTION_LOG_ENTRIES};
use crate::retry::Retry;
use crate::state::JobState;
use crate::store::{HeartbeatResult, Job, Lease, Record, RecordId, Store};
use crate::wakeup::{WakeupSender, Wakeups};

/// Retry and reset policy of a [`MemoryStore`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MemoryStoreOptions {
    /// How many times a job that errored is tried again before it fails. Default 0.
    pub max_num_retries: u32,
    /// How long an errored job waits before it is eligible again. Measured on
    /// tokio's clock, so tests can use a paused clock. Default 0.
    pub retry_after: Duration,
    /// How many times [`MemoryStore::reset`] requeues a job before failing it. Default 0.
    pub max_num_resets: u32,
}

/// Extra dequeue conditions for a [`MemoryStore`]: a predicate over the record.
pub struct MemoryConditions<R>(Option<Predicate<R>>);

type Predicate<R> = Arc<dyn Fn(&R) -> bool + Send + Sync>;

impl<R> MemoryConditions<R> {
    /// Only records for which `predicate` is true are dequeued.
    pub fn filter(predicate: impl Fn(&R) -> bool + Send + Sync + 'static) -> Self {
        MemoryConditions(Some(Arc::new(predicate)))
    }

    fn matches(&self, record: &R) -> bool {
        self.0.as_ref().is_none_or(|p| p(record))
    }
}

impl<R> Default for MemoryConditions<R> {
    fn default() -> Self {
        MemoryConditions(None)
    }
}

impl<R> Clone for MemoryConditions<R> {
    fn clone(&self) -> Self {
        MemoryConditions(self.0.clone())
    }
}

impl<R> fmt::Debug for MemoryConditions<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "MemoryConditions(filter)"
        } else {
            "MemoryConditions(none)"
        })
    }
}

/// A job dequeued from a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryJob<R> {
    /// The record.
    pub record: R,
    lease: Lease,
}

impl<R: Record> Job for MemoryJob<R> {
    type Record = R;

    fn record(&self) -> &R {
        &self.record
    }

    fn lease(&self) -> Lease {
        self.lease
    }
}

/// Everything a [`MemoryStore`] knows about one job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobSnapshot<R> {
    /// The record.
    pub record: R,
    /// Its state.
    pub state: JobState,
    /// The message of the last failure.
    pub failure_message: Option<String>,
    /// How many attempts failed.
    pub num_failures: u32,
    /// How many times it was reset.
    pub num_resets: u32,
    /// Whether cancellation was requested.
    pub cancel: bool,
    /// The execution log of the latest attempt.
    pub execution_logs: Vec<ExecutionLogEntry>,
    /// The host of the worker that claimed it last ("" when queued).
    pub worker_hostname: String,
}

struct Entry<R> {
    snapshot: JobSnapshot<R>,
    token: i64,
    process_after: Option<Instant>,
}

struct Inner<R> {
    jobs: BTreeMap<RecordId, Entry<R>>,
    next_token: i64,
}

/// An in-memory [`Store`] that behaves like the Postgres store: the same states,
/// retries, fencing and cancellation. Jobs are dequeued in id order.
///
/// Use it to unit-test a handler; it passes the same conformance suite as the
/// Postgres store.
pub struct MemoryStore<R> {
    options: MemoryStoreOptions,
    inner: Mutex<Inner<R>>,
    /// Wakes idle workers on enqueue and requeue, as a LISTEN connection would.
    wakeups: WakeupSender,
}

impl<R> fmt::Debug for MemoryStore<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("options", &self.options)
            .field("jobs", &self.lock().jobs.len())
            .finish()
    }
}

impl<R> Default for MemoryStore<R> {
    fn default() -> Self {
        MemoryStore::new(MemoryStoreOptions::default())
    }
}

impl<R> MemoryStore<R> {
    /// An empty store with the given policy.
    pub fn new(options: MemoryStoreOptions) -> Self {
        let wakeups = WakeupSender::new();
        wakeups.set_live(true);
        MemoryStore {
            options,
            inner: Mutex::new(Inner {
                jobs: BTreeMap::new(),
                next_token: 1,
            }),
            wakeups,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<R>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<R: Record + Clone> MemoryStore<R> {
    /// Adds a queued job; its id is `record.id()`. Returns false (and changes
    /// nothing) if that id exists.
    pub fn enqueue(&self, record: R) -> bool {
        self.enqueue_after(record, None)
    }

    /// Adds a job that becomes eligible at `process_after` (tokio's clock).
    pub fn enqueue_after(&self, record: R, process_after: Option<Instant>) -> bool {
        let mut inner = self.lock();
        let id = record.id();
        if inner.jobs.contains_key(&id) {
            return false;
        }
        inner.jobs.insert(
            id,
            Entry {
                snapshot: JobSnapshot {
                    record,
                    state: JobState::Queued,
                    failure_message: None,
                    num_failures: 0,
                    num_resets: 0,
                    cancel: false,
                    execution_logs: Vec::new(),
                    worker_hostname: String::new(),
                },
                token: 0,
                process_after,
            },
        );
        drop(inner);
        self.wakeups.wake();
        true
    }

    /// The state of job `id`.
    pub fn state(&self, id: RecordId) -> Option<JobState> {
        self.lock().jobs.get(&id).map(|e| e.snapshot.state)
    }

    /// A copy of everything known about job `id`.
    pub fn snapshot(&self, id: RecordId) -> Option<JobSnapshot<R>> {
        self.lock().jobs.get(&id).map(|e| e.snapshot.clone())
    }

    /// How many jobs are in `state`.
    pub fn count(&self, state: JobState) -> usize {
        self.lock()
            .jobs
            .values()
            .filter(|e| e.snapshot.state == state)
            .count()
    }

    /// Asks for job `id` to be canceled (what `UPDATE … SET cancel = true` does in
    /// Postgres). Returns false if there is no such job.
    pub fn request_cancel(&self, id: RecordId) -> bool {
        match self.lock().jobs.get_mut(&id) {
            Some(e) => {
                e.snapshot.cancel = true;
                true
            }
            None => false,
        }
    }

    /// What the resetter does to a stalled processing job: back to `queued`, or
    /// `failed` once it was reset `max_num_resets` times. Returns the new state,
    /// or `None` if the job is not processing.
    pub fn reset(&self, id: RecordId) -> Option<JobState> {
        let max = self.options.max_num_resets;
        let mut inner = self.lock();
        let e = inner.jobs.get_mut(&id)?;
        if e.snapshot.state != JobState::Processing {
            return None;
        }
        e.snapshot.worker_hostname.clear();
        if e.snapshot.num_resets < max {
            e.snapshot.num_resets += 1;
            e.snapshot.state = JobState::Queued;
            self.wakeups.wake();
        } else {
            e.snapshot.state = JobState::Failed;
            e.snapshot.failure_message =
                Some("job processor died while handling this job too many times".into());
        }
        Some(e.snapshot.state)
    }

    /// Runs `f` on the entry if `lease` still owns it.
    fn with_owned<T>(&self, lease: Lease, f: impl FnOnce(&mut Entry<R>) -> T) -> Option<T> {
        let mut inner = self.lock();
        let e = inner.jobs.get_mut(&lease.id)?;
        (e.snapshot.state == JobState::Processing && e.token == lease.token).then(|| f(e))
    }
}
impl<R: Record + Clone> Store for MemoryStore<R> {
    type Record = R;
    type Job = MemoryJob<R>;
    type Conditions = MemoryConditions<R>;

    fn wakeups(&self) -> Option<Wakeups> {
        Some(self.wakeups.subscribe())
    }

    async fn queued_count(&self) -> Result<u64, BoxError> {
        let n = self
            .lock()
            .jobs
            .values()
            .filter(|e| matches!(e.snapshot.state, JobState::Queued | JobState::Errored))
            .count();
        Ok(n as u64)
    }

    async fn dequeue(
        &self,
        hostname: &str,
        conditions: &MemoryConditions<R>,
        limit: usize,
    ) -> Result<Vec<MemoryJob<R>>, BoxError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { jobs, next_token } = &mut *inner;
        let mut out = Vec::new();
        let mut claimed = 0;
        for (id, e) in jobs.iter_mut() {
            if claimed >= limit {
                break;
            }
            let eligible = matches!(e.snapshot.state, JobState::Queued | JobState::Errored)
                && e.process_after.is_none_or(|t| t <= now)
                && conditions.matches(&e.snapshot.record);
            if !eligible {
                continue;
            }
            if e.snapshot.cancel {
                // Canceled while it waited: record that instead of handing it out.
                // Like the Postgres claim, it uses up one slot of this call.
                claimed += 1;
                e.snapshot.state = JobState::Canceled;
                e.snapshot.num_failures += 1;
                e.snapshot.failure_message = Some("job was canceled before it started".to_owned());
                continue;
            }
            claimed += 1;
            e.token = *next_token;
            *next_token += 1;
            e.snapshot.state = JobState::Processing;
            e.snapshot.worker_hostname = hostname.to_owned();
            e.snapshot.execution_logs.clear();
            e.snapshot.failure_message = None;
            out.push(MemoryJob {
                record: e.snapshot.record.clone(),
                lease: Lease {
                    id: *id,
                    token: e.token,
                },
            });
        }
        Ok(out)
    }

    async fn heartbeat(&self, leases: &[Lease]) -> Result<HeartbeatResult, BoxError> {
        let mut result = HeartbeatResult::default();
        for lease in leases {
            if let Some(cancel) = self.with_owned(*lease, |e| e.snapshot.cancel) {
                result.known.push(lease.id);
                if cancel {
                    result.cancel.push(lease.id);
                }
            }
        }
        Ok(result)
    }

    async fn add_execution_log_entry(
        &self,
        lease: Lease,
        entry: &ExecutionLogEntry,
    ) -> Result<Option<usize>, BoxError> {
        let appended = self.with_owned(lease, |e| {
            let logs = &mut e.snapshot.execution_logs;
            if logs.len() >= MAX_EXECUTION_LOG_ENTRIES {
                return Err(Error::ExecutionLogFull {
                    id: lease.id,
                    limit: MAX_EXECUTION_LOG_ENTRIES,
                });
            }
            let mut entry = entry.clone();
            entry.start_time.get_or_insert_with(|| "now".to_owned());
            logs.push(entry);
            Ok(logs.len() - 1)
        });
        Ok(appended.transpose()?)
    }

    async fn update_execution_log_entry(
        &self,
        lease: Lease,
        index: usize,
        entry: &ExecutionLogEntry,
    ) -> Result<bool, BoxError> {
        Ok(self
            .with_owned(lease, |e| match e.snapshot.execution_logs.get_mut(index) {
                Some(slot) => {
                    *slot = entry.clone();
                    true
                }
                None => false,
            })
            .unwrap_or(false))
    }

    /// Whether the lease still owns the job, like the Postgres store's lock.
    async fn open(&self, job: &mut MemoryJob<R>) -> Result<bool, BoxError> {
        Ok(self.with_owned(job.lease, |_| ()).is_some())
    }

    async fn mark_complete(&self, job: &mut MemoryJob<R>) -> Result<bool, BoxError> {
        Ok(self
            .with_owned(job.lease, |e| e.snapshot.state = JobState::Completed)
            .is_some())
    }

    /// A `retry` override's limit and delay replace the options' (its delay
    /// without jitter, on tokio's clock).
    async fn mark_errored(
        &self,
        job: &mut MemoryJob<R>,
        message: &str,
        retry: Option<&Retry>,
    ) -> Result<Option<JobState>, BoxError> {
        let max = retry
            .and_then(|r| r.max_retries)
            .unwrap_or(self.options.max_num_retries);
        let policy = retry.and_then(|r| r.delay.as_ref());
        Ok(self.with_owned(job.lease, |e| {
            let s = &mut e.snapshot;
            let delay = policy.map_or(self.options.retry_after, |p| p.delay(s.num_failures));
            s.num_failures += 1;
            s.failure_message = Some(message.to_owned());
            s.state = if s.cancel {
                JobState::Canceled
            } else if s.num_failures > max {
                JobState::Failed
            } else {
                e.process_after = Some(Instant::now() + delay);
                JobState::Errored
            };
            s.state
        }))
    }

    async fn mark_failed(&self, job: &mut MemoryJob<R>, message: &str) -> Result<bool, BoxError> {
        Ok(self
            .with_owned(job.lease, |e| {
                let s = &mut e.snapshot;
                s.num_failures += 1;
                s.failure_message = Some(message.to_owned());
                s.state = if s.cancel {
                    JobState::Canceled
                } else {
                    JobState::Failed
                };
            })
            .is_some())
    }

    async fn mark_canceled(&self, job: &mut MemoryJob<R>, message: &str) -> Result<bool, BoxError> {
        Ok(self
            .with_owned(job.lease, |e| {
                let s = &mut e.snapshot;
                s.num_failures += 1;
                s.failure_message = Some(message.to_owned());
                s.state = JobState::Canceled;
            })
            .is_some())
    }

    async fn mark_snoozed(
        &self,
        job: &mut MemoryJob<R>,
        delay: Duration,
    ) -> Result<bool, BoxError> {
        Ok(self
            .with_owned(job.lease, |e| {
                let s = &mut e.snapshot;
                s.worker_hostname.clear();
                s.state = if s.cancel {
                    JobState::Canceled
                } else {
                    e.process_after = Some(Instant::now() + delay);
                    JobState::Queued
                };
            })
            .is_some())
    }

    async fn requeue(&self, job: &mut MemoryJob<R>) -> Result<bool, BoxError> {
        let requeued = self
            .with_owned(job.lease, |e| {
                e.snapshot.state = JobState::Queued;
                e.snapshot.worker_hostname.clear();
                e.process_after = None;
            })
            .is_some();
        if requeued {
            self.wakeups.wake();
        }
        Ok(requeued)
    }
}
