//! A client in a cluster: it registers its process in the worker registry
//! and campaigns for its table's lease; the singletons (the resetter, the
//! purger, the gauges, the services added with
//! [`leader_service`](super::ClientBuilder::leader_service)) run only while
//! it leads, each given the term to fence its writes by.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::{
    DEFAULT_LEADER_TABLE, LeaderElection, LeaderOptions, Leadership, Node, NodeOptions,
};
use crate::error::Result;
use crate::service::Service;

/// How a [`Client`](super::Client) joins a cluster of processes
/// (`ClientOptions::cluster`): the registry row it keeps and the lease it
/// campaigns for. The tables come from `dbworker migration --nodes`.
///
/// ```
/// let options: dbworker::ClientOptions = serde_json::from_str(r#"{
///     "cluster": { "node": { "dead_after": "15s" }, "lease": "10s" }
/// }"#).unwrap();
/// assert_eq!(options.cluster.unwrap().lease, std::time::Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// The process's registry row (its handler count and the control
    /// tables it honours are filled in by the client).
    pub node: NodeOptions,
    /// The lease table. Default [`DEFAULT_LEADER_TABLE`].
    pub leader_table: String,
    /// What is led. Default: the job table's name, so the clients of one
    /// table elect one leader.
    pub scope: Option<String>,
    /// How long a lease lasts after each renewal (see
    /// [`LeaderOptions::lease`]). Default 6 s.
    #[serde(with = "workerutil::duration")]
    pub lease: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            node: NodeOptions::default(),
            leader_table: DEFAULT_LEADER_TABLE.to_owned(),
            scope: None,
            lease: Duration::from_secs(6),
        }
    }
}

/// How a singleton runs: until `stop` (a client outside a cluster runs
/// them all, as if it always led), or for one term.
pub(super) enum Run {
    Always(CancellationToken),
    Leading(Leadership),
}

/// A singleton service, started once (outside a cluster) or once per term.
pub(super) type LeaderStarter =
    Arc<dyn Fn(Run) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// How long a singleton that panicked waits before it runs again.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// `service`, to run as a singleton; an error is logged with its name. One
/// that panics is logged and run again a second later, for as long as its
/// run lasts: a term's singletons share one task, so an unwinding one would
/// take the resetter and the others down with it while the lease is still
/// held (and outside a cluster it would be gone for good).
pub(super) fn leader_starter(service: impl Service) -> LeaderStarter {
    let service = Arc::new(service);
    Arc::new(move |run| {
        let service = service.clone();
        Box::pin(async move {
            let stop = match &run {
                Run::Always(stop) => stop.clone(),
                Run::Leading(leadership) => leadership.token(),
            };
            loop {
                let ran = std::panic::AssertUnwindSafe(async {
                    match &run {
                        Run::Always(stop) => service.run(stop.clone()).await,
                        Run::Leading(leadership) => service.run_as_leader(leadership.clone()).await,
                    }
                })
                .catch_unwind()
                .await;
                match ran {
                    Ok(Ok(())) => return,
                    Ok(Err(err)) => {
                        tracing::error!(service = service.name(), error = %err, "a client's service stopped");
                        return;
                    }
                    Err(panic) => {
                        let panic = workerutil::panic_message(&panic);
                        tracing::error!(service = service.name(), %panic, "a client's service panicked; running it again in a second");
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RESTART_AFTER) => {}
                }
            }
        })
    })
}

/// Every singleton for a new term, as one future (on the election's term
/// task, so an aborted election stops them all); done when they all are.
fn start_term(
    services: &[LeaderStarter],
    leadership: &Leadership,
) -> impl Future<Output = ()> + Send + use<> {
    let terms = services
        .iter()
        .map(|start| start(Run::Leading(leadership.clone())));
    futures_util::future::join_all(terms).map(|_| ())
}

/// The registry row and the election of a client in a cluster.
pub(super) struct Membership {
    pub(super) node: Node,
    election: LeaderElection,
}

impl Membership {
    /// Registers this process and prepares its campaign for `scope`.
    pub(super) async fn join(
        pool: &PgPool,
        options: &ClusterOptions,
        scope: String,
    ) -> Result<Membership> {
        let node = Node::new(pool, options.node.clone()).await?;
        let mut lo = LeaderOptions::new(options.scope.clone().unwrap_or(scope), node.id());
        lo.leader_table = options.leader_table.clone();
        lo.lease = options.lease;
        let election = match LeaderElection::new(pool, lo).await {
            Ok(election) => election,
            Err(err) => {
                // The row registered above would otherwise pass for a live
                // process until it ages out.
                let _ = node.deregister().await;
                return Err(err);
            }
        };
        Ok(Membership { node, election })
    }

    /// Heartbeats the row and campaigns until `stop` fires; while leading,
    /// runs `services`, each with the term.
    pub(super) fn spawn(
        self,
        services: Vec<LeaderStarter>,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let beat = tokio::spawn(self.node.run(stop.clone()));
        let stop = stop.clone();
        let election = self.election;
        let campaign = tokio::spawn(async move {
            election
                .run(stop, move |leadership| start_term(&services, &leadership))
                .await;
        });
        vec![campaign, beat]
    }
}
