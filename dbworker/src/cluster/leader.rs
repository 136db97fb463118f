//! Leader election for singleton services (the resetter, retention, consumer
//! rebalancing, an application's own singletons): a lease row per scope,
//! taken only once the lease has expired (database clock) and renewed by its
//! holder. Each new leadership is a new term, one above the last; the
//! services receive it as a [`Leadership`] and fence their writes with it, so
//! a leader paused past its lease cannot write once another node leads — even
//! in the moment before it notices.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::metrics::LEADER;
use crate::runner::{Next, Pass, Runner};
use crate::sql;

use super::leadership::Leadership;

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
        // Added to the database's clock: past its range, no campaign succeeds.
        Error::check_max_durations([("lease", self.lease)])?;
        Ok(())
    }
}

/// Campaigns for a scope's lease on behalf of a node, and runs the leader's
/// services while it holds it, each given the term's [`Leadership`].
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, node: dbworker::cluster::Node, resetter: std::sync::Arc<dbworker::Resetter>) -> Result<(), dbworker::Error> {
/// use dbworker::Service;
/// use dbworker::cluster::{LeaderElection, LeaderOptions};
/// let election = LeaderElection::new(&pool, LeaderOptions::new("jobs", node.id())).await?;
/// let stop = tokio_util::sync::CancellationToken::new();
/// // Only the leader resets, each pass fenced by its term; it stops when
/// // leadership ends or `stop` fires.
/// election
///     .run(stop, move |leadership| {
///         let resetter = resetter.clone();
///         async move { let _ = resetter.run_as_leader(leadership).await; }
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
    /// The term [`try_lead`](Self::try_lead) last took or renewed.
    held: Arc<Mutex<Option<i64>>>,
}

impl LeaderElection {
    /// An election of `options.scope` for the node `options.node_id` (the
    /// lease table must exist).
    pub async fn new(pool: &PgPool, options: LeaderOptions) -> Result<LeaderElection> {
        options.validate()?;
        let table = Relation::parse("leader_table", &options.leader_table)?;
        let mut problems = crate::schema_check::missing_columns(
            pool,
            &table,
            "leader table",
            &["scope", "node_id", "term", "acquired_at", "expires_at"],
            "`dbworker migration --nodes` prints it",
        )
        .await?;
        // Taking and renewing the lease upsert it; fencing a write locks it
        // FOR SHARE, which needs UPDATE too.
        problems.extend(
            Grants::new("leader election")
                .on(
                    "leader table",
                    &table,
                    &[Privilege::Select, Privilege::Insert, Privilege::Update],
                )
                .problems(pool)
                .await?,
        );
        crate::schema_check::none(problems)?;
        Ok(LeaderElection {
            pool: pool.clone(),
            table,
            node_id: options.node_id.clone(),
            options,
            held: Arc::new(Mutex::new(None)),
        })
    }

    /// Takes or renews the lease; returns whether this node leads now.
    pub async fn try_lead(&self) -> Result<bool> {
        let held = *self.held.lock().expect("not poisoned");
        let now = self.campaign(held).await?;
        *self.held.lock().expect("not poisoned") = now;
        Ok(now.is_some())
    }

    /// The term this node holds after renewing `held`, or after trying to
    /// take the lease when it holds none.
    async fn campaign(&self, held: Option<i64>) -> Result<Option<i64>> {
        let (scope, node, lease) = (&self.options.scope, &self.node_id, self.options.lease);
        let statement = match held {
            Some(term) => sql::leader_renew(&self.table, scope, node, term, lease),
            None => sql::leader_acquire(&self.table, scope, node, lease),
        };
        let row = statement
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("leader_acquire"))?;
        Ok(row.map(|r| r.get::<i64, _>("term")))
    }

    /// Gives the lease up, if [`try_lead`](Self::try_lead) holds it.
    pub async fn release(&self) -> Result<()> {
        let held = self.held.lock().expect("not poisoned").take();
        match held {
            Some(term) => self.release_term(term).await,
            None => Ok(()),
        }
    }

    async fn release_term(&self, term: i64) -> Result<()> {
        sql::leader_release(&self.table, &self.options.scope, &self.node_id, term)
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
    /// starts `services(leadership)` for the new term; the leadership's
    /// token is canceled when leadership ends (a renewal failed or found the
    /// term over, or `stop` fired), and the services are awaited before
    /// campaigning again. A renewal not confirmed within two thirds of the
    /// lease ends leadership, so a leader cut off from the database usually
    /// steps down before its lease can pass to another; a leader paused for
    /// longer than that learns it late, which is why services fence their
    /// writes ([`Leadership::fence`]). On `stop` the lease is released, so a
    /// standby takes over at once.
    pub async fn run<F, Fut>(&self, stop: CancellationToken, mut services: F)
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Erased: a pass generic over a closure that captures anything could
        // not be proven `Send` (a compiler limit with async trait methods),
        // so a campaign could not be spawned.
        let services: StartTerm = Box::new(move |leadership| Box::pin(services(leadership)));
        // Attempts a third of the lease apart from their starts, and no
        // back-off: the lease's arithmetic (a standby takes over within
        // `lease + lease / 3`) counts on it.
        let mut campaign = Campaign {
            election: self,
            stop: &stop,
            services,
            renew_every: self.options.lease / 3,
            leading: None,
        };
        Runner::every(campaign.renew_every)
            .steady_rate()
            .run(&stop, &mut campaign)
            .await;
        if let Some((term, token, task)) = campaign.leading {
            let scope = &self.options.scope;
            step_down(scope, token, task).await;
            if let Err(err) = self.release_term(term).await {
                tracing::warn!(scope = %scope, error = %err, "releasing the lease failed; it expires on its own");
            }
        }
    }

    /// Starts the services for a new `term`.
    fn lead(
        &self,
        term: i64,
        stop: &CancellationToken,
        services: &mut StartTerm,
    ) -> (i64, CancellationToken, AbortOnDropHandle<()>) {
        let scope = &self.options.scope;
        tracing::info!(scope = %scope, node = %self.node_id, term, "became leader");
        metrics::gauge!(LEADER, "scope" => scope.clone()).set(1.0);
        let token = stop.child_token();
        let leadership = Leadership {
            pool: self.pool.clone(),
            table: self.table.clone(),
            scope: scope.clone(),
            node_id: self.node_id.clone(),
            term,
            lease: self.options.lease,
            token: token.clone(),
        };
        let task = AbortOnDropHandle::new(tokio::spawn(services(leadership)));
        (term, token, task)
    }
}

/// What starts the leader's services for a term.
type StartTerm =
    Box<dyn FnMut(Leadership) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// [`LeaderElection::run`] as the runner sees it: one attempt to take or
/// renew the lease per pass, starting or stopping the services.
struct Campaign<'a> {
    election: &'a LeaderElection,
    stop: &'a CancellationToken,
    services: StartTerm,
    renew_every: Duration,
    /// The term held, its services' token and task. Dropping it (the run
    /// aborted) aborts the services too: nothing keeps running as leader
    /// without the loop that renews the lease.
    leading: Option<(i64, CancellationToken, AbortOnDropHandle<()>)>,
}

impl Pass for Campaign<'_> {
    fn span(&self) -> tracing::Span {
        let e = self.election;
        tracing::info_span!("leader_election", scope = %e.options.scope, node = %e.node_id)
    }

    async fn pass(&mut self) -> Next {
        let e = self.election;
        let scope = &e.options.scope;
        let held = self.leading.as_ref().map(|(term, _, _)| *term);
        // A stop abandons only the attempt: a step-down under way still
        // awaits the services.
        let (limit, started) = (self.renew_every * 2, tokio::time::Instant::now());
        let now = tokio::select! {
            biased;
            // The runner sees `stop` before it waits again.
            () = self.stop.cancelled() => return Next::Interval,
            r = tokio::time::timeout(limit, e.campaign(held)) => match r {
                // `timeout` polls the renewal before its deadline, so a
                // renewal whose lock wait ended as the deadline passed (its
                // own fenced transaction cut off, a busy runtime) would
                // count: the promise is "confirmed within two thirds of the
                // lease", so it ends leadership.
                Ok(Ok(Some(_))) if held.is_some() && started.elapsed() > limit => {
                    tracing::warn!(scope = %scope, node = %e.node_id, late = ?started.elapsed(), "lease renewal confirmed too late; stepping down");
                    None
                }
                Ok(Ok(now)) => now,
                Ok(Err(err)) => {
                    tracing::warn!(scope = %scope, node = %e.node_id, error = %err, "leader election failed; will retry");
                    None
                }
                Err(_) => {
                    tracing::warn!(scope = %scope, node = %e.node_id, "leader election timed out; will retry");
                    None
                }
            },
        };
        match (now, self.leading.take()) {
            (Some(term), Some(held)) if term == held.0 => self.leading = Some(held),
            (now, Some((term, token, task))) => {
                tracing::warn!(scope = %scope, node = %e.node_id, term, "lost leadership; stopping the leader's services");
                step_down(scope, token, task).await;
                if let Some(term) = now {
                    self.leading = Some(e.lead(term, self.stop, &mut self.services));
                }
            }
            (Some(term), None) => self.leading = Some(e.lead(term, self.stop, &mut self.services)),
            (None, None) => {}
        }
        Next::Interval
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
        .fetch_optional(pool)
        .await
        .map_err(Error::db("leader_current"))?;
    Ok(row.map(|r| r.get("node_id")))
}

/// One scope's lease, as [`leases`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// What is led.
    pub scope: String,
    /// The node that holds (or last held) the lease.
    pub node_id: String,
    /// Its term.
    pub term: i64,
    /// Whether the lease is held now (not expired, database clock).
    pub held: bool,
}

/// Every scope's lease in `leader_table`, by scope: who leads each now, and
/// who led last where the lease has expired.
pub async fn leases(pool: &PgPool, leader_table: &str) -> Result<Vec<Lease>> {
    let table = Relation::parse("leader_table", leader_table)?;
    let rows = sql::leaders_all(&table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("leaders_all"))?;
    Ok(rows
        .iter()
        .map(|r| Lease {
            scope: r.get("scope"),
            node_id: r.get("node_id"),
            term: r.get("term"),
            held: r.get("held"),
        })
        .collect())
}
