//! The crate's one error type.

/// A boxed error from a store or a hook, kept whole so its source chain survives.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors returned by `workerutil`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An options struct failed validation.
    #[error("invalid option `{field}`: {reason}")]
    InvalidOption {
        /// The field that is wrong.
        field: &'static str,
        /// Why it is wrong.
        reason: String,
    },
    /// A kind was registered twice in a [`KindRegistry`](crate::KindRegistry)
    /// (as a kind or an alias): the second would silently replace the first.
    #[error("kind {0:?} is registered twice; each kind (and alias) has one handler")]
    DuplicateKind(String),
    /// The host name could not be determined and none was configured.
    #[error("cannot determine the worker hostname: {0}")]
    Hostname(#[source] std::io::Error),
    /// The store cannot be driven with these worker options (see
    /// [`Store::check_worker_options`](crate::Store::check_worker_options)).
    #[error("the store does not fit these worker options: {0}")]
    IncompatibleOptions(#[source] BoxError),
    /// A job's execution log already holds
    /// [`MAX_EXECUTION_LOG_ENTRIES`](crate::MAX_EXECUTION_LOG_ENTRIES) entries for
    /// this attempt; the entry was not appended.
    #[error(
        "the execution log of job {id} is full: an attempt may append at most {limit} entries; update existing entries instead"
    )]
    ExecutionLogFull {
        /// The job.
        id: crate::RecordId,
        /// The cap.
        limit: usize,
    },
    /// [`Worker::run_until`](crate::Worker::run_until) was called on a worker
    /// that ran already: a worker runs once.
    #[error("this worker ran already: a worker runs once, build another")]
    AlreadyRan,
    /// Returned by a store's [`mark_complete`](crate::Store::mark_complete)
    /// or [`mark_waiting`](crate::Store::mark_waiting) when the job could not
    /// be completed for a reason of its own: its transaction's commit failed
    /// on a healthy connection (a deferred constraint, a trigger), so nothing
    /// it wrote landed. The store has written nothing else; the worker
    /// records the attempt as [`Outcome::Errored`](crate::Outcome::Errored)
    /// with this cause, under the job's retry policy, as if the handler had
    /// returned it.
    #[error("completing the job failed: {0}")]
    CompletionFailed(#[source] BoxError),
    /// Returned by [`mark_complete`](crate::Store::mark_complete) or
    /// [`mark_waiting`](crate::Store::mark_waiting) when the completion
    /// could not be written for a reason not the job's (its connection was
    /// lost, a deadlock, a timeout), and says what the store then wrote
    /// itself: `Some(Queued)`, the job put back to run again (the worker
    /// reports [`Outcome::Interrupted`](crate::Outcome::Interrupted));
    /// `Some(Failed)`, failed past the store's reset limit (reported
    /// [`Outcome::Errored`](crate::Outcome::Errored) with no retry left);
    /// `None`, nothing (the resetter will put it back; reported
    /// interrupted, not marked). The worker records nothing more.
    #[error("the completion was not written: {source}")]
    CompletionNotWritten {
        /// The state the store wrote instead, if any.
        state: Option<crate::JobState>,
        /// Why the completion was not written.
        #[source]
        source: BoxError,
    },
    /// Returned by a store's [`open`](crate::Store::open) when it put the
    /// job back in the queue itself, counting nothing, rather than let it
    /// start (dbworker: its queue was paused while it waited in the
    /// claim-ahead buffer). The worker records nothing more and reports
    /// [`Outcome::Withheld`](crate::Outcome::Withheld) with the reason.
    #[error("the job was put back before it started: {0}")]
    Withheld(String),
    /// A store operation failed.
    #[error("store operation `{op}` failed: {source}")]
    Store {
        /// The operation that failed.
        op: &'static str,
        /// The store's error.
        #[source]
        source: BoxError,
    },
}

/// Renders an error and its sources as one line: `outer: cause: root cause`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Many errors repeat their source in their own message; don't print it twice.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
