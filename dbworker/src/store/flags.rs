//! `ForbiddenFlags`: the flags a store's claims skip, fixed or asked for
//! before each claim.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::error::Error;

/// Returns the flags forbidden right now; see [`ForbiddenFlags::callback`].
pub type ForbiddenFlagsFn = Arc<dyn Fn() -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// Jobs carrying any of these flags (set by [`NewJob::flags`](crate::NewJob::flags))
/// are skipped by the store's claims; they stay queued for a store (or a
/// later claim) that allows them. Set in `ClaimOptions::forbidden_flags`
/// (a store's `StoreOptions::claim`); the table needs a `flags_column`.
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

    /// Refuses a fixed flag holding a NUL character: bound into the claim,
    /// it would make every claim fail (`text` cannot hold one).
    pub(crate) fn check(&self) -> Result<(), Error> {
        let ForbiddenFlags::Fixed(flags) = self else {
            return Ok(());
        };
        match flags.iter().find(|f| f.contains('\0')) {
            Some(flag) => Err(Error::InvalidOption {
                field: "forbidden_flags",
                reason: format!(
                    "flag {flag:?} holds a NUL character (U+0000), which PostgreSQL cannot store; no job can carry it"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The flags forbidden now, sorted and without duplicates, so one set
    /// always gives one claim condition (and one claim cursor).
    pub(crate) async fn current(&self) -> Vec<String> {
        let mut flags = match self {
            ForbiddenFlags::Fixed(flags) => flags.clone(),
            ForbiddenFlags::Callback(f) => f().await,
        };
        // A callback's flag holding a NUL would fail every claim. No job can
        // carry it (`text` cannot hold one), so leaving it out skips the same jobs.
        if flags.iter().any(|f| f.contains('\0')) {
            tracing::warn!(flags = ?flags, "a forbidden flag holds a NUL character (U+0000); no job can carry it, so it is left out of the claim");
            flags.retain(|f| !f.contains('\0'));
        }
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

    #[tokio::test]
    async fn a_flag_holding_nul_is_refused_fixed_and_left_out_asked() {
        let err = ForbiddenFlags::fixed(["ok", "a\0b"]).check().unwrap_err();
        assert!(
            err.to_string().contains(r#"flag "a\0b" holds a NUL"#),
            "{err}"
        );
        assert!(ForbiddenFlags::fixed(["ok"]).check().is_ok());
        let asked = ForbiddenFlags::callback(|| async { vec!["a\0b".to_owned(), "c".to_owned()] });
        assert!(asked.check().is_ok());
        assert_eq!(asked.current().await, ["c"]);
    }
}
