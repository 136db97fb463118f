//! The states a job record moves through.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The state of a job record. See `docs/state-machine.md` for the transitions.
/// Serialized by the name stored in the `state` column (`"completed"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for the jobs it depends on (workflows, `dbworker migration
    /// --workflows`); never claimed. The last dependency's completion makes it
    /// `queued`.
    Pending,
    /// Waiting to be dequeued (once `process_after` is due).
    Queued,
    /// Claimed by a worker and being handled.
    Processing,
    /// Handled successfully. Final.
    Completed,
    /// The last attempt failed with a retryable error; it will be dequeued again
    /// once its retry delay has elapsed.
    Errored,
    /// Failed for good: a non-retryable error, retries exhausted, or too many resets. Final.
    Failed,
    /// Canceled on request while it ran. Final.
    Canceled,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Queued,
        JobState::Processing,
        JobState::Completed,
        JobState::Errored,
        JobState::Failed,
        JobState::Canceled,
    ];

    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Queued => "queued",
            JobState::Processing => "processing",
            JobState::Completed => "completed",
            JobState::Errored => "errored",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }

    /// Whether no further transition happens from this state.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Canceled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text was not a known job state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
        }
        assert!("done".parse::<JobState>().is_err());
    }

    #[test]
    fn serde_uses_the_column_names() {
        for state in JobState::ALL {
            let text = serde_json::to_string(&state).unwrap();
            assert_eq!(text, format!("{:?}", state.as_str()));
            assert_eq!(serde_json::from_str::<JobState>(&text).unwrap(), state);
        }
    }
}
