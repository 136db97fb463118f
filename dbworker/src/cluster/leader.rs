//! Leader election for singleton services (the resetter, retention, queue
//! gauges): a lease row per scope, taken and renewed by one statement that
//! only succeeds for the holder or once the lease has expired (database
//! clock). Leadership is an optimisation — every service it runs is already
//! safe to run twice — so a partitioned leader that has not yet noticed it
//! lost the lease costs duplicate work, never a wrong result.

use std::future::Future;
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::metrics::LEADER;
use crate::sql;

/// The lease table's default name.
pub const DEFAULT_LEADER_TABLE: &str = "dbworker_leaders";

/// How an election runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LeaderOptions {
    /// The node campaigning (its registry id, `Node::id`). Required.
    pub node_id: String,
    /// What is led: one leader per scope. Use the job table's name for its
    /// maintenance, or an application's name for its singletons.
    pub scope: String,
    /// The lease table. Default [`DEFAULT_LEADER_TABLE`].
    pub leader_table: String,
    /// How long a lease lasts after each renewal (database clock). The leader
    /// renews every third of it; a standby tries as often, so after a leader
    /// dies without releasing (SIGKILL, network cut) another one leads within
    /// `lease + lease / 3`; after a graceful stop (the lease is released)
    /// within `lease / 3`. Default 6 s.
    pub lease: Duration,
}

impl LeaderOptions {
    /// An election for `scope` on behalf of the node `node_id`, with defaults.
    pub fn new(scope: impl Into<String>, node_id: impl Into<String>) -> Self {
        LeaderOptions {
            node_id: node_id.into(),
            scope: scope.into(),
            leader_table: DEFAULT_LEADER_TABLE.to_owned(),
            lease: Duration::from_secs(6),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        Relation::parse("leader_table", &self.leader_table)?;
        if self.scope.trim().is_empty() {
            return invalid("scope", "must not be empty");
        }
        if self.node_id.trim().is_empty() {
            return invalid("node_id", "must not be empty");
        }
        if self.lease < Duration::from_millis(30) {
            return invalid("lease", "must be at least 30ms");
        }
        Ok(())
    }
}

/// Campaigns for a scope's lease on behalf of a node, and runs the leader's
/// services while it holds it.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, node: dbworker::cluster::Node, resetter: std::sync::Arc<dbworker::Resetter>) -> Result<(), dbworker::Error> {
/// use dbworker::cluster::{LeaderElection, LeaderOptions};
/// let election = LeaderElection::new(&pool, LeaderOptions::new("jobs", node.id())).await?;
/// let stop = tokio_util::sync::CancellationToken::new();
/// // Only the leader resets; it stops when leadership ends or `stop` fires.
/// election
///     .run(stop, move |leading| {
///         let resetter = resetter.clone();
///         async move { resetter.run(leading, |_| {}).await }
///     })
///     .await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaderElection {
    pool: PgPool,
    table: Relation,
    node_id: String,
    options: LeaderOptions,
}

impl LeaderElection {
    /// An election of `options.scope` for the node `options.node_id` (the
    /// lease table must exist).
    pub async fn new(pool: &PgPool, options: LeaderOptions) -> Result<LeaderElection> {
        options.validate()?;
        let table = Relation::parse("leader_table", &options.leader_table)?;
        crate::schema_check::none(
            crate::schema_check::missing_columns(
                pool,
                &table,
                "leader table",
                &["scope", "node_id", "acquired_at", "expires_at"],
                "`dbworker migration --nodes` prints it",
            )
            .await?,
        )?;
        Ok(LeaderElection {
            pool: pool.clone(),
            table,
            node_id: options.node_id.clone(),
            options,
        })
    }

    /// Takes or renews the lease; returns whether this node leads now.
    pub async fn try_lead(&self) -> Result<bool> {
        let row = sql::leader_acquire(
            &self.table,
            &self.options.scope,
            &self.node_id,
            self.options.lease,
        )
        .query()
        .fetch_optional(&self.pool)
        .await
        .map_err(Error::db("leader_acquire"))?;
        Ok(row.is_some_and(|r| r.get::<String, _>("node_id") == self.node_id))
    }

    /// Gives the lease up, if this node holds it.
    pub async fn release(&self) -> Result<()> {
        sql::leader_release(&self.table, &self.options.scope, &self.node_id)
            .query()
            .execute(&self.pool)
            .await
            .map_err(Error::db("leader_release"))?;
        Ok(())
    }

    /// The node leading the scope now, if any (database clock).
    pub async fn leader(&self) -> Result<Option<String>> {
        current_leader(&self.pool, &self.options.leader_table, &self.options.scope).await
    }

    /// Campaigns until `stop` fires. Each time this node becomes leader it
    /// starts `services(leading)`; `leading` is canceled when leadership ends
    /// (a renewal failed or found another leader, or `stop` fired), and the
    /// services are awaited before campaigning again. A renewal not confirmed
    /// within two thirds of the lease ends leadership, so a leader cut off
    /// from the database steps down before its lease can pass to another.
    /// On `stop` the lease is released, so a standby takes over at once.
    pub async fn run<F, Fut>(&self, stop: CancellationToken, mut services: F)
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let renew_every = self.options.lease / 3;
        let scope = self.options.scope.clone();
        // Dropping `run` (its task aborted) aborts the services too: nothing
        // keeps running as leader without the loop that renews the lease.
        let mut leading: Option<(CancellationToken, AbortOnDropHandle<()>)> = None;
        loop {
            let attempt = Instant::now();
            let leads = tokio::select! {
                () = stop.cancelled() => break,
                r = tokio::time::timeout(renew_every * 2, self.try_lead()) => match r {
                    Ok(Ok(leads)) => leads,
                    Ok(Err(err)) => {
                        tracing::warn!(scope = %scope, node = %self.node_id, error = %err, "leader election failed; will retry");
                        false
                    }
                    Err(_) => {
                        tracing::warn!(scope = %scope, node = %self.node_id, "leader election timed out; will retry");
                        false
                    }
                },
            };
            match (leads, leading.take()) {
                (true, Some(held)) => leading = Some(held),
                (true, None) => {
                    tracing::info!(scope = %scope, node = %self.node_id, "became leader");
                    metrics::gauge!(LEADER, "scope" => scope.clone()).set(1.0);
                    let token = stop.child_token();
                    let task = AbortOnDropHandle::new(tokio::spawn(services(token.clone())));
                    leading = Some((token, task));
                }
                (false, Some((token, task))) => {
                    tracing::warn!(scope = %scope, node = %self.node_id, "lost leadership; stopping the leader's services");
                    step_down(&scope, token, task).await;
                }
                (false, None) => {}
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(attempt + renew_every) => {}
            }
        }
        if let Some((token, task)) = leading {
            step_down(&scope, token, task).await;
            if let Err(err) = self.release().await {
                tracing::warn!(scope = %scope, error = %err, "releasing the lease failed; it expires on its own");
            }
        }
    }
}

async fn step_down(scope: &str, token: CancellationToken, task: AbortOnDropHandle<()>) {
    token.cancel();
    if let Err(err) = task.await {
        tracing::error!(scope = %scope, error = %err, "a leader service panicked");
    }
    metrics::gauge!(LEADER, "scope" => scope.to_owned()).set(0.0);
}

/// The node holding `scope`'s unexpired lease in `leader_table`, if any.
pub async fn current_leader(
    pool: &PgPool,
    leader_table: &str,
    scope: &str,
) -> Result<Option<String>> {
    let table = Relation::parse("leader_table", leader_table)?;
    let row = sql::leader_current(&table, scope)
        .query()
        .fetch_optional(pool)
        .await
        .map_err(Error::db("leader_current"))?;
    Ok(row.map(|r| r.get("node_id")))
}
