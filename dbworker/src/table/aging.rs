//! [`Aging`]: how a waiting job's priority rises with its wait.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Priority aging ([`JobTableOptions::aging`](crate::JobTableOptions::aging)):
/// a job's effective priority is its priority plus one level for every
/// `interval` it has waited since it became runnable, at most `max_boost`
/// levels and never above the highest level waiting. Claims take the highest
/// effective priority first, and among equals the job that rose the most.
///
/// Nothing is written: the claim reads the head of each priority level
/// (one index probe per level) and ranks those few rows. So a job of
/// priority `p`, below the top level `top`, starts at the latest
/// `(top − p) × interval` after it became runnable, plus the time to drain
/// the jobs that rose as far as it did before it.
///
/// ```
/// let aging: dbworker::Aging = serde_json::from_str(r#"{"interval": "60s", "max_boost": 3}"#).unwrap();
/// assert_eq!(aging.interval, std::time::Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Aging {
    /// How long a job waits to rise one level (at least 10 ms).
    #[serde(with = "workerutil::duration")]
    pub interval: Duration,
    /// The most levels a job rises. `None`: up to the top level waiting.
    #[serde(default)]
    pub max_boost: Option<u32>,
}

impl Aging {
    /// A level every `interval`, up to the top.
    pub fn every(interval: Duration) -> Aging {
        Aging {
            interval,
            max_boost: None,
        }
    }

    /// At most `levels` levels.
    pub fn max_boost(mut self, levels: u32) -> Aging {
        self.max_boost = Some(levels);
        self
    }

    /// Checks the interval (at least 10 ms) and the boost (at least 1).
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: &str| {
            Err(Error::InvalidOption {
                field: "aging",
                reason: reason.to_owned(),
            })
        };
        if self.interval < Duration::from_millis(10) {
            return invalid("interval must be at least 10ms");
        }
        // Claims divide a wait by it in SQL; bounded like every option's time.
        if self.interval > workerutil::duration::MAX {
            return invalid("interval must be at most 100 years");
        }
        if self.max_boost == Some(0) {
            return invalid("max_boost must be at least 1 (leave it unset for no limit)");
        }
        Ok(())
    }
}
