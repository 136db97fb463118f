//! `Service`: the one public contract of a long-running part of a process.
//! A [`Client`](crate::Client) runs its own; an application that assembles
//! its own runs one on a task of its own.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::cluster::Leadership;

/// A long-running part of a process: the resetter, the purger, the cron
/// scheduler, the history recorder, the queue gauges. Each runs until
/// `stop` fires, and a [`Client`](crate::Client) runs its own; run one alone
/// with `tokio::spawn(async move { service.run(stop).await })`.
///
/// A failed pass is logged and retried (with a back-off): `run` returns an
/// error only when the service cannot go on at all. Run by a
/// [`Client`](crate::Client), a service that panics is logged and run again
/// a second later.
pub trait Service: Send + Sync + 'static {
    /// A short name for logs: `resetter`, `purger`, `cron`, `history`.
    fn name(&self) -> &str;

    /// Runs until `stop` fires (a pass in progress finishes first).
    fn run(&self, stop: CancellationToken) -> impl Future<Output = crate::Result<()>> + Send;

    /// Runs while this process leads (a [`LeaderElection`](crate::cluster::LeaderElection)
    /// term): until the leadership's token fires. A service whose writes
    /// must not overlap another leader's fences them by the term (the
    /// resetter's passes, the purger's batches); the default runs
    /// [`run`](Self::run) until leadership ends, unfenced.
    fn run_as_leader(
        &self,
        leadership: Leadership,
    ) -> impl Future<Output = crate::Result<()>> + Send {
        self.run(leadership.token())
    }
}
