//! `JobArgs`: a Rust type whose values are a kind of job's arguments.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::JobDefaults;
use crate::error::{Error, Result};

/// The arguments of one kind of job: serialized into the job's `jsonb`
/// payload column by [`NewJob::args`](crate::NewJob::args), deserialized
/// for its [`JobHandler`](super::JobHandler), with [`KIND`](Self::KIND) in
/// the kind column.
///
/// ```
/// use std::time::Duration;
/// use dbworker::{JobArgs, JobDefaults};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail {
///     to: String,
///     subject: String,
/// }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
///
///     // Optional: what every job of the kind gets unless told otherwise.
///     fn defaults() -> JobDefaults {
///         JobDefaults::new().max_retries(3).timeout(Duration::from_secs(30))
///     }
/// }
/// # assert_eq!(SendEmail::defaults().max_retries, Some(3));
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind: the value of the job's kind column, which picks its handler.
    /// Renaming it strands the jobs already enqueued under the old name.
    const KIND: &'static str;

    /// Other kinds whose jobs this type's handler runs: the old names of a
    /// renamed kind, so jobs enqueued under them still run (River's kind
    /// aliases). Default: none.
    const ALIASES: &'static [&'static str] = &[];

    /// The kind's defaults: queue and priority for new jobs, and the retry
    /// limit, retry delay and timeout its handler runs with. Default: none,
    /// so the table's, the store's and the worker's apply.
    fn defaults() -> JobDefaults {
        JobDefaults::new()
    }

    /// The job's fairness key on a fair table ([`NewJob::fair_key`](crate::NewJob::fair_key)):
    /// usually the customer or account the arguments name. Default: none.
    fn fair_key(&self) -> Option<String> {
        None
    }
}

/// Refuses an empty kind, which no handler could be registered for usefully.
pub(crate) fn check_kind(kind: &str) -> Result<()> {
    if kind.is_empty() {
        return Err(Error::InvalidOption {
            field: "KIND",
            reason: "a kind must not be empty".into(),
        });
    }
    Ok(())
}
