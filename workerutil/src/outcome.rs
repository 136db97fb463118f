//! What a handler returns and what became of a job.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{BoxError, error_chain};
use crate::state::JobState;

/// What a handler returns instead of success. It keeps its source error.
///
/// `?` on any error gives a [`HandlerError::Retryable`]; wrap poison inputs in
/// [`HandlerError::non_retryable`] so they fail at once instead of being
/// retried; [`snooze`](HandlerError::snooze) and [`cancel`](HandlerError::cancel)
/// are not failures of the attempt but decisions about the job.
#[non_exhaustive]
pub enum HandlerError {
    /// The job may succeed if tried again: the store marks it `errored`, or
    /// `failed` once its retries are exhausted.
    Retryable(BoxError),
    /// Trying again cannot help (a malformed payload, say): the job is `failed`.
    NonRetryable(BoxError),
    /// Run the job again after this delay, without counting a failure or a
    /// retry (waiting on a rate-limited API, say): the job is queued again.
    Snooze(Duration),
    /// The job must not run again, and it did not fail (the order it was for
    /// was withdrawn, say): the job is `canceled`, with this reason as its
    /// message. Any write of the attempt's transaction is rolled back.
    Cancel(BoxError),
    /// End this attempt by waiting for the signal `signal`, at most `timeout`
    /// ([`wait_for`](HandlerError::wait_for)): the handler's slot is freed,
    /// and the job runs again when the signal arrives (or one already did),
    /// or when the timeout is up, whichever comes first. Not a failure.
    Wait {
        /// The signal's name.
        signal: String,
        /// The longest wait: the job's next run time if no signal comes.
        timeout: Duration,
    },
}

impl HandlerError {
    /// A retryable error.
    pub fn retryable(err: impl Into<BoxError>) -> Self {
        HandlerError::Retryable(err.into())
    }

    /// A non-retryable (poison) error.
    pub fn non_retryable(err: impl Into<BoxError>) -> Self {
        HandlerError::NonRetryable(err.into())
    }

    /// Puts the job back in the queue to run again after `delay`, without
    /// counting a failure or a retry (waiting on a rate-limited API, say).
    ///
    /// ```
    /// use std::time::Duration;
    /// use workerutil::HandlerError;
    /// let err = HandlerError::snooze(Duration::from_secs(30));
    /// assert_eq!(err.snoozed_for(), Some(Duration::from_secs(30)));
    /// ```
    pub fn snooze(delay: Duration) -> Self {
        HandlerError::Snooze(delay)
    }

    /// Cancels the job for good, with `reason` as its message (River's
    /// `JobCancel`).
    ///
    /// ```
    /// use workerutil::HandlerError;
    /// let err = HandlerError::cancel("the order was withdrawn");
    /// assert!(!err.is_retryable());
    /// assert_eq!(err.to_string(), "canceled: the order was withdrawn");
    /// ```
    pub fn cancel(reason: impl Into<BoxError>) -> Self {
        HandlerError::Cancel(reason.into())
    }

    /// Ends the attempt waiting for the signal `signal`, at most `timeout`:
    /// the job runs again when it arrives (or at once if it already did), or
    /// when the timeout is up. A store without signals runs it again after
    /// the timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workerutil::HandlerError;
    /// let err = HandlerError::wait_for("payment_confirmed", Duration::from_secs(1800));
    /// assert_eq!(err.to_string(), "waiting for signal payment_confirmed, at most 30m");
    /// ```
    pub fn wait_for(signal: impl Into<String>, timeout: Duration) -> Self {
        HandlerError::Wait {
            signal: signal.into(),
            timeout,
        }
    }

    /// The delay, when this is a [`HandlerError::Snooze`].
    pub fn snoozed_for(&self) -> Option<Duration> {
        match self {
            HandlerError::Snooze(delay) => Some(*delay),
            _ => None,
        }
    }

    /// Whether a retry may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, HandlerError::Retryable(_))
    }

    /// The source error; `None` for a snooze, which has none.
    pub fn source_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            HandlerError::Retryable(e)
            | HandlerError::NonRetryable(e)
            | HandlerError::Cancel(e) => Some(e.as_ref()),
            HandlerError::Snooze(_) | HandlerError::Wait { .. } => None,
        }
    }
}

impl<E> From<E> for HandlerError
where
    E: Into<BoxError>,
{
    fn from(err: E) -> Self {
        HandlerError::Retryable(err.into())
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retryable(e) => f.debug_tuple("Retryable").field(e).finish(),
            HandlerError::NonRetryable(e) => f.debug_tuple("NonRetryable").field(e).finish(),
            HandlerError::Snooze(d) => f.debug_tuple("Snooze").field(d).finish(),
            HandlerError::Cancel(e) => f.debug_tuple("Cancel").field(e).finish(),
            HandlerError::Wait { signal, timeout } => f
                .debug_struct("Wait")
                .field("signal", signal)
                .field("timeout", timeout)
                .finish(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retryable(e) | HandlerError::NonRetryable(e) => {
                f.write_str(&error_chain(e.as_ref()))
            }
            HandlerError::Snooze(d) => write!(f, "snoozed for {}", humanize(*d)),
            HandlerError::Cancel(e) => write!(f, "canceled: {}", error_chain(e.as_ref())),
            HandlerError::Wait { signal, timeout } => {
                write!(
                    f,
                    "waiting for signal {signal}, at most {}",
                    humanize(*timeout)
                )
            }
        }
    }
}

/// A shared handler error, as kept in an [`Outcome`].
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What became of one job attempt. Passed to `Handler::post_handle` and in
/// [`WorkerEvent::JobFinished`](crate::WorkerEvent::JobFinished).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler succeeded; the job was marked completed.
    Completed,
    /// The handler returned a retryable error; the job was marked errored.
    Errored(SharedError),
    /// The handler returned a non-retryable error; the job was marked failed.
    Failed(SharedError),
    /// The handler ran past the maximum runtime; the job was marked errored.
    TimedOut(Duration),
    /// Cancellation was requested through the store; the job was marked canceled.
    Canceled,
    /// The handler canceled the job ([`HandlerError::cancel`]); it was marked
    /// canceled with the reason.
    CanceledByHandler(SharedError),
    /// The store no longer knows the job under this worker's lease (it was reset
    /// and possibly claimed by another worker); nothing was written.
    Lost,
    /// Heartbeats failed for longer than the configured bound, so the worker
    /// canceled the job itself; it was marked errored if the store was reachable.
    HeartbeatExpired(Duration),
    /// A hook panicked; the job was marked errored with the panic message.
    Panicked(String),
    /// The job did not finish here and was put back in the queue: a
    /// shutdown interrupted it, or the store could not write its completion
    /// for a reason not its own (a lost connection, a deadlock) and put it
    /// back ([`Error::CompletionNotWritten`](crate::Error::CompletionNotWritten)).
    Interrupted,
    /// The store put the job back in the queue before it started, counting
    /// nothing, for the reason given (dbworker: its queue was paused while
    /// it waited in the claim-ahead buffer); the handler never ran, though
    /// `pre_handle` had (it runs before the store's `open`), and the job
    /// counts among the worker's `num_total_jobs`, as a lost one does.
    Withheld(String),
    /// The handler asked to run the job again after this delay
    /// ([`HandlerError::snooze`]); it was put back in the queue without
    /// counting a failure.
    Snoozed(Duration),
    /// The handler ended its attempt waiting for a signal
    /// ([`HandlerError::wait_for`]); the job runs again when it arrives or
    /// its timeout is up.
    Waiting {
        /// The signal's name.
        signal: String,
        /// The longest wait.
        timeout: Duration,
    },
}

impl Outcome {
    pub(crate) fn from_handler_error(err: HandlerError) -> Self {
        match err {
            HandlerError::Retryable(e) => Outcome::Errored(Arc::from(e)),
            HandlerError::NonRetryable(e) => Outcome::Failed(Arc::from(e)),
            HandlerError::Snooze(delay) => Outcome::Snoozed(delay),
            HandlerError::Cancel(e) => Outcome::CanceledByHandler(Arc::from(e)),
            HandlerError::Wait { signal, timeout } => Outcome::Waiting { signal, timeout },
        }
    }

    /// The failure message recorded with the job, if the outcome is a failure.
    pub fn failure_message(&self) -> Option<String> {
        match self {
            Outcome::Completed
            | Outcome::Lost
            | Outcome::Interrupted
            | Outcome::Withheld(_)
            | Outcome::Snoozed(_)
            | Outcome::Waiting { .. } => None,
            Outcome::Errored(e) | Outcome::Failed(e) => Some(error_chain(e.as_ref())),
            Outcome::TimedOut(limit) => Some(format!(
                "job exceeded maximum runtime of {}",
                humanize(*limit)
            )),
            Outcome::Canceled => Some("job was canceled".to_owned()),
            Outcome::CanceledByHandler(e) => Some(format!(
                "canceled by its handler: {}",
                error_chain(e.as_ref())
            )),
            Outcome::HeartbeatExpired(limit) => Some(format!(
                "worker canceled the job: heartbeats failed for more than {}",
                humanize(*limit)
            )),
            Outcome::Panicked(message) => Some(format!("handler panicked: {message}")),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Errored(_) => "errored",
            Outcome::Failed(_) => "failed",
            Outcome::TimedOut(_) => "timed_out",
            Outcome::Canceled | Outcome::CanceledByHandler(_) => "canceled",
            Outcome::Lost => "lost",
            Outcome::HeartbeatExpired(_) => "heartbeat_expired",
            Outcome::Panicked(_) => "panicked",
            Outcome::Interrupted => "interrupted",
            Outcome::Withheld(_) => "withheld",
            Outcome::Snoozed(_) => "snoozed",
            Outcome::Waiting { .. } => "waiting",
        }
    }
}

impl Outcome {
    /// The outcome as the metrics by kind label it (seed 002's vocabulary),
    /// once recorded: `ok`; `retry` (an errored mark that runs again) or
    /// `failed` (its retries used up), as the store's `written` state says;
    /// `poison` (a non-retryable error); `canceled`, `snoozed`, `waiting`,
    /// `interrupted`, `withheld`; `lost` when the mark was not taken.
    pub(crate) fn label(&self, marked: bool, written: Option<JobState>) -> &'static str {
        if !marked {
            return "lost";
        }
        match self {
            Outcome::Completed => "ok",
            Outcome::Errored(_)
            | Outcome::TimedOut(_)
            | Outcome::Panicked(_)
            | Outcome::HeartbeatExpired(_) => match written {
                Some(JobState::Failed) => "failed",
                Some(JobState::Canceled) => "canceled",
                // Errored, or queued again after a lost connection.
                _ => "retry",
            },
            Outcome::Failed(_) => "poison",
            Outcome::Canceled | Outcome::CanceledByHandler(_) => "canceled",
            Outcome::Snoozed(_) => "snoozed",
            Outcome::Waiting { .. } => "waiting",
            Outcome::Interrupted => "interrupted",
            Outcome::Withheld(_) => "withheld",
            Outcome::Lost => "lost",
        }
    }
}

/// Formats a duration for failure messages: `1.5s`, `250ms`, `2m`.
pub(crate) fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("could not fetch")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn question_mark_is_retryable_and_keeps_source() {
        fn work() -> Result<(), HandlerError> {
            Err(Outer(std::io::Error::other("connection refused")))?;
            Ok(())
        }
        let err = work().unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "could not fetch: connection refused");
        let outcome = Outcome::from_handler_error(err);
        assert_eq!(
            outcome.failure_message().unwrap(),
            "could not fetch: connection refused"
        );
        assert_eq!(outcome.kind(), "errored");
    }

    #[test]
    fn non_retryable_fails() {
        let err = HandlerError::non_retryable("bad payload");
        assert!(!err.is_retryable());
        assert_eq!(Outcome::from_handler_error(err).kind(), "failed");
    }

    #[test]
    fn timeout_message_names_limit() {
        assert_eq!(
            Outcome::TimedOut(Duration::from_secs(90))
                .failure_message()
                .unwrap(),
            "job exceeded maximum runtime of 90s"
        );
        assert_eq!(humanize(Duration::from_millis(1500)), "1.500s");
        assert_eq!(humanize(Duration::from_secs(120)), "2m");
    }
}
