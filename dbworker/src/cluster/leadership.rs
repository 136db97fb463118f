//! `Leadership`: one term of a node's leadership of a scope, as the leader's
//! services receive it. A term is a number that grows with every new
//! leadership of the scope; a write fenced by it commits only while that term
//! still holds the lease, so a leader that was paused (SIGSTOP, a VM
//! migration, a long page fault) past its lease cannot write once another
//! node leads, even before it notices.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql;

/// One term of leadership: the term's number, its fence, and the token that
/// fires when leadership ends. [`LeaderElection::run`](super::LeaderElection::run)
/// hands one to the services it starts.
#[derive(Debug, Clone)]
pub struct Leadership {
    pub(super) pool: PgPool,
    pub(super) table: Relation,
    pub(super) scope: String,
    pub(super) node_id: String,
    pub(super) term: i64,
    /// Also how long a fenced transaction may sit idle.
    pub(super) lease: Duration,
    pub(super) token: CancellationToken,
}

impl Leadership {
    /// The term: greater than every earlier term of this scope.
    pub fn term(&self) -> i64 {
        self.term
    }

    /// The scope led.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Fires when this node's leadership ends as far as it knows (a renewal
    /// failed or found another leader, or the election stopped). A paused
    /// node learns it late; [`fence`](Self::fence) does not depend on it.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// The lease: its renewals wait for every fenced transaction.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Waits until [`token`](Self::token) fires.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Fences the caller's transaction by this term: run it first in the
    /// transaction that holds the leader's writes. It locks the lease row
    /// (`FOR SHARE`) if this node still holds the lease in this term and the
    /// lease has not expired (database clock); otherwise it returns
    /// [`Error::LeadershipLost`] and the caller must roll back. Until the
    /// transaction ends no other node can take the lease, so everything it
    /// writes commits before any newer term begins. Keep fenced transactions
    /// short: the lock also holds up this node's own renewals, and a
    /// transaction left idle for a lease is cut off by the server.
    pub async fn fence(&self, tx: &mut PgConnection) -> Result<()> {
        let held = sql::leader_fence(
            &self.table,
            &self.scope,
            &self.node_id,
            self.term,
            self.lease,
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("leader_fence"))?;
        match held {
            Some(_) => Ok(()),
            None => Err(Error::LeadershipLost {
                scope: self.scope.clone(),
                term: self.term,
            }),
        }
    }

    /// Begins a transaction on the election's pool and fences it
    /// ([`fence`](Self::fence)).
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
        self.fence(&mut tx).await?;
        Ok(tx)
    }
}
