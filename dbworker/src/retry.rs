//! Retry policies, shared with `workerutil`: [`RetryPolicy`] (the store's,
//! `StoreOptions::retry`) and [`Retry`] (a kind's or handler's override). The
//! Postgres store computes the delay in SQL, on the database's clock; see
//! `sql::marks`.

pub use workerutil::{Retry, RetryPolicy};

/// The retry rule of one errored mark, resolved: how many retries (unless the
/// job's own column says otherwise) and the delay policy.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryRule {
    pub(crate) max_num_retries: u32,
    pub(crate) policy: RetryPolicy,
}

impl RetryRule {
    /// The store's `max_num_retries` and `policy`, with what `over` sets in
    /// their place. A delay that fails [`RetryPolicy::check`] (a negative
    /// factor would give a negative delay) is not used: the store's applies,
    /// as the worker does (and warns about) for a handler's answer.
    pub(crate) fn resolve(
        max_num_retries: u32,
        policy: &RetryPolicy,
        over: Option<&Retry>,
    ) -> Self {
        RetryRule {
            max_num_retries: over.and_then(|r| r.max_retries).unwrap_or(max_num_retries),
            policy: over
                .and_then(|r| r.delay.clone())
                .filter(|delay| delay.check().is_ok())
                .unwrap_or_else(|| policy.clone()),
        }
    }
}
