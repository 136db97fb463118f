//! Who runs a group and who runs each consumer: every process of a group
//! keeps a membership row fresh (and removes it when it stops), and the
//! leader deals the group's consumers round-robin over the live members only,
//! so a process registered in the node registry for anything else (a job
//! worker, another group) never gets a consumer it would not run.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::cluster::Leadership;
use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::runner::{Next, Pass, Runner};
use crate::sql;

/// The members table beside `assignments`: `…_assignments` becomes
/// `…_members`, any other name gets `_members` appended.
pub(crate) fn member_table(assignments: &Relation) -> Relation {
    let name = match assignments.name.strip_suffix("_assignments") {
        Some(stem) => format!("{stem}_members"),
        None => format!("{}_members", assignments.name),
    };
    Relation {
        schema: assignments.schema.clone(),
        alias: name.clone(),
        name,
    }
}

/// How long a membership row stays live without a refresh: the registry's
/// `dead_after`, but never less than three rebalance intervals (the refresh
/// runs at that interval). A killed process drops out with its registry
/// heartbeat, after `dead_after`, whichever is longer here.
pub(crate) fn member_fresh(dead_after: Duration, interval: Duration) -> Duration {
    dead_after.max(interval.saturating_mul(3))
}

/// This process's membership of a group.
#[derive(Debug, Clone)]
pub(crate) struct Membership {
    pub(crate) pool: PgPool,
    pub(crate) members: Relation,
    pub(crate) group: String,
    pub(crate) node_id: String,
    pub(crate) interval: Duration,
}

impl Membership {
    /// Records (or refreshes) the membership, stamped by the database.
    pub(crate) async fn beat(&self) -> Result<()> {
        sql::log_member_beat(&self.members, &self.group, &self.node_id)
            .execute(&self.pool)
            .await
            .map_err(Error::db("log_member_beat"))?;
        Ok(())
    }

    /// Removes the membership: the next rebalance deals this process's
    /// consumers to the others.
    pub(crate) async fn leave(&self) {
        if let Err(err) = sql::log_member_leave(&self.members, &self.group, &self.node_id)
            .execute(&self.pool)
            .await
        {
            tracing::warn!(group = %self.group, error = %err,
                "leaving the group failed; its consumers move once the membership is stale");
        }
    }

    /// Refreshes the membership every interval until `stop` fires. A failed
    /// refresh is tried again an interval later, no slower: the row is live
    /// for three intervals at least, so two failures in a row do not make a
    /// live process's membership stale (its consumers dealt away and back).
    pub(crate) async fn run(&self, stop: &CancellationToken) {
        Runner::every(self.interval)
            .backoff_up_to(self.interval)
            .run(stop, &mut Beats(self))
            .await;
    }
}

struct Beats<'a>(&'a Membership);

impl Pass for Beats<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("membership", group = %self.0.group)
    }

    async fn pass(&mut self) -> Next {
        match self.0.beat().await {
            Ok(()) => Next::Interval,
            Err(err) => {
                tracing::warn!(group = %self.0.group, error = %err, "membership refresh failed; will retry");
                Next::BackOff
            }
        }
    }
}

/// What the leader of a group needs to rebalance it.
#[derive(Debug, Clone)]
pub(crate) struct Rebalancer {
    pub(crate) group: String,
    pub(crate) names: Vec<String>,
    pub(crate) assignments: Relation,
    pub(crate) nodes: Relation,
    pub(crate) members: Relation,
    pub(crate) interval: Duration,
    pub(crate) dead_after: Duration,
}

impl Rebalancer {
    /// Rebalances every `interval` while `leadership` lasts. A failed
    /// rebalance is logged and retried after a back-off: twice the interval,
    /// doubling with each failure in a row up to four intervals (consumers
    /// of a dead process wait for it, so it comes back soon once the
    /// database does).
    pub(crate) async fn run(&self, leadership: &Leadership) {
        Runner::every(self.interval)
            .backoff_up_to(self.interval.saturating_mul(4))
            .run(
                &leadership.token(),
                &mut Rebalances {
                    rebalancer: self,
                    leadership,
                },
            )
            .await;
    }

    /// [`Rebalancer::once`] in a transaction fenced by the leader's term: a
    /// leader whose term is over moves nothing and forgets no member.
    async fn as_leader(&self, leadership: &Leadership) -> Result<Vec<(String, String)>> {
        let mut tx = leadership.begin().await?;
        let moved = self.once(&mut tx).await?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(moved)
    }

    /// One rebalance: forgets stale members, then deals the group's
    /// consumers over the live ones; returns the consumers that moved, with
    /// their new node.
    async fn once(&self, conn: &mut PgConnection) -> Result<Vec<(String, String)>> {
        let fresh = member_fresh(self.dead_after, self.interval);
        sql::log_members_prune(&self.members, &self.group, fresh)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("log_members_prune"))?;
        let rows = sql::log_rebalance(
            &self.assignments,
            &self.nodes,
            &self.members,
            &self.group,
            self.names.clone(),
            self.dead_after,
            fresh,
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("log_rebalance"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get("consumer_name"), r.get("node_id")))
            .collect())
    }
}

/// The leader's rebalancing as the runner sees it: one rebalance per pass.
struct Rebalances<'a> {
    rebalancer: &'a Rebalancer,
    leadership: &'a Leadership,
}

impl Pass for Rebalances<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("rebalance", group = %self.rebalancer.group, term = self.leadership.term())
    }

    async fn pass(&mut self) -> Next {
        let r = self.rebalancer;
        match r.as_leader(self.leadership).await {
            Ok(moved) => {
                if !moved.is_empty() {
                    tracing::info!(group = %r.group, ?moved, "rebalanced consumers");
                }
                Next::Interval
            }
            Err(err) => {
                tracing::warn!(group = %r.group, error = %err, "rebalance failed; will retry");
                Next::BackOff
            }
        }
    }
}
