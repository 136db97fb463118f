//! Writes Postgres rolled back for a reason that passes — a deadlock victim,
//! a serialization failure — are sent again: such a write changed nothing,
//! and a job whose handler finished must not wait for the resetter because
//! its mark lost a lock cycle with another worker's (the workflow release
//! trigger locks dependents and edges of several jobs in one statement).

use std::future::Future;
use std::time::Duration;

/// Tries in all of a write that keeps failing this way.
const TRIES: u32 = 8;
/// The wait before the second try; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Whether Postgres rolled `err` back as a deadlock victim (`40P01`) or for
/// a serialization failure (`40001`). Not a lost connection: its write may
/// have committed.
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40P01" || code == "40001")
}

/// Runs `write` (a whole statement or transaction, nothing else in it) again
/// while its error is `transient`, at most [`TRIES`] times in all.
pub(crate) async fn again_if_transient<T, E, Fut>(
    what: &str,
    mut write: impl FnMut() -> Fut,
    transient: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut backoff = FIRST_BACKOFF;
    let mut tries = 1;
    loop {
        match write().await {
            Err(err) if tries < TRIES && transient(&err) => {
                tracing::debug!(what, tries, error = %err, "rolled back by Postgres as passing; writing it again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                tries += 1;
            }
            result => return result,
        }
    }
}
