//! `ForbiddenFlags`: the flags a store's claims skip, fixed or asked for
//! before each claim.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

/// Returns the flags forbidden right now; see [`ForbiddenFlags::callback`].
pub type ForbiddenFlagsFn = Arc<dyn Fn() -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// Jobs carrying any of these flags (set by [`NewJob::flags`](crate::NewJob::flags))
/// are skipped by the store's claims; they stay queued for a store (or a
/// later claim) that allows them. Set in `StoreOptions::forbidden_flags`.
///
/// ```
/// use dbworker::ForbiddenFlags;
/// // Always skip jobs flagged "gpu" on this host:
/// let fixed = ForbiddenFlags::fixed(["gpu"]);
/// // Or ask before each claim, from a cache kept up to date elsewhere:
/// let cache = std::sync::Arc::new(std::sync::Mutex::new(vec!["slow-api".to_owned()]));
/// let asked = ForbiddenFlags::callback(move || {
///     let now = cache.lock().unwrap().clone();
///     async move { now }
/// });
/// # let _ = (fixed, asked);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum ForbiddenFlags {
    /// The same flags for every claim.
    Fixed(Vec<String>),
    /// Called before each claim; the claim skips what it returns (an empty
    /// list skips nothing).
    Callback(ForbiddenFlagsFn),
}

impl ForbiddenFlags {
    /// The same flags for every claim.
    pub fn fixed<I, S>(flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ForbiddenFlags::Fixed(flags.into_iter().map(Into::into).collect())
    }

    /// `f` is called before every claim of every worker on the store, and
    /// the claim waits for it: it must be cheap. Answer from a cache you
    /// refresh elsewhere (a timer, LISTEN/NOTIFY), not with a query per call.
    pub fn callback<F, Fut>(f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<String>> + Send + 'static,
    {
        ForbiddenFlags::Callback(Arc::new(move || Box::pin(f())))
    }

    /// The flags forbidden now, sorted and without duplicates, so one set
    /// always gives one claim condition (and one claim cursor).
    pub(crate) async fn current(&self) -> Vec<String> {
        let mut flags = match self {
            ForbiddenFlags::Fixed(flags) => flags.clone(),
            ForbiddenFlags::Callback(f) => f().await,
        };
        flags.sort_unstable();
        flags.dedup();
        flags
    }
}

impl fmt::Debug for ForbiddenFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForbiddenFlags::Fixed(flags) => f.debug_tuple("Fixed").field(flags).finish(),
            ForbiddenFlags::Callback(_) => f.write_str("Callback(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_set_of_flags_reads_the_same_however_given() {
        let fixed = ForbiddenFlags::fixed(["b", "a", "b"]);
        assert_eq!(fixed.current().await, ["a", "b"]);
        let asked = ForbiddenFlags::callback(|| async { vec!["b".to_owned(), "a".to_owned()] });
        assert_eq!(asked.current().await, ["a", "b"]);
    }
}
