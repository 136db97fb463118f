//! The `Resetter`: requeues or fails stalled processing rows. Runs inside a
//! worker process or alone (see the `dbworker reset` command).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::cluster::Leadership;
use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::metrics::{RESET_ERRORS_TOTAL, RESET_FAILURES_TOTAL, RESET_PASS_SECONDS, RESETS_TOTAL};
use crate::runner::{Next, Pass, Runner};
use crate::sql::Table;
use crate::store::{DbStore, ResetConfig, ResetOutcome, StallOptions, reset_pass};
use crate::table::JobTable;

/// How a resetter runs; the table comes from its [`JobTable`].
///
/// Deserializable from a config file: every field left out keeps its
/// default, durations are written as in [`workerutil::duration`], and an
/// unknown field is refused.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ResetterOptions {
    /// The resetter's name, for logs. Default `"resetter"`.
    pub name: String,
    /// When a processing job is stalled and how often it may be reset: the
    /// same values as the table's stores (`StoreOptions::stall`).
    pub stall: StallOptions,
    /// Time between passes. Default 30 s.
    #[serde(with = "workerutil::duration")]
    pub interval: Duration,
    /// The worker registry (`dbworker migration --nodes`): processing jobs
    /// whose `worker_hostname` names a process dead for `dead_after` are
    /// requeued at once, without waiting for `stalled_max_age` (rows a live
    /// transaction locks are still skipped). `None` (the default): only
    /// heartbeat age counts.
    pub node_table: Option<String>,
    /// With `node_table`: a process whose registry heartbeat is older than
    /// this is dead, and its jobs whose own heartbeat is as old are
    /// requeued. Default 18 s: a worker cut off from the database stops its
    /// jobs itself at most its `heartbeat_failure_limit` (15 s by default)
    /// plus three of its heartbeat intervals (1 s by default) after its last
    /// recorded heartbeat. Keep it above your workers' limit plus three
    /// heartbeat intervals: a process cut off for less would otherwise run a
    /// job beside its requeued copy. (A [`Client`](crate::Client) sets it so
    /// from its own options.)
    #[serde(with = "workerutil::duration")]
    pub dead_after: Duration,
}

/// [`ResetterOptions::dead_after`]'s default: the workers' default
/// `heartbeat_failure_limit` plus three default heartbeat intervals.
pub(crate) const DEFAULT_RESCUE_AFTER: Duration = Duration::from_secs(18);

impl Default for ResetterOptions {
    fn default() -> Self {
        ResetterOptions {
            name: "resetter".to_owned(),
            stall: StallOptions::default(),
            interval: Duration::from_secs(30),
            node_table: None,
            dead_after: DEFAULT_RESCUE_AFTER,
        }
    }
}

impl ResetterOptions {
    /// Options named `name`, with defaults.
    pub fn new(name: impl Into<String>) -> Self {
        ResetterOptions {
            name: name.into(),
            ..ResetterOptions::default()
        }
    }

    /// Options for a resetter of `store`'s table: named after it, with its
    /// stall settings, so the two agree on when a job is stalled.
    pub fn for_store<R: workerutil::Record>(store: &DbStore<R>) -> Self {
        ResetterOptions {
            name: format!("{}_resetter", store.name()),
            stall: store.stall(),
            ..ResetterOptions::default()
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| Error::InvalidOption {
            field,
            reason: reason.to_owned(),
        };
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        self.stall.validate()?;
        Error::check_max_durations([("interval", self.interval)])?;
        if self.interval.is_zero() {
            return Err(invalid("interval", "must be positive"));
        }
        if let Some(t) = &self.node_table {
            dead_nodes(t, self.dead_after)?;
        }
        Ok(())
    }

    fn resolve(&self, table: &JobTable) -> Result<ResetConfig> {
        self.validate()?;
        let t = table.sql();
        Ok(ResetConfig {
            table: t.table.clone(),
            columns: t.columns.clone(),
            stalled_max_age: self.stall.stalled_max_age,
            max_num_resets: self.stall.max_num_resets,
            message: self.stall.reset_failure_message.clone(),
            dead_nodes: match &self.node_table {
                Some(n) => Some(dead_nodes(n, self.dead_after)?),
                None => None,
            },
            error_history: t.error_history.clone(),
        })
    }
}

/// The registry table and its dead age, checked.
fn dead_nodes(node_table: &str, dead_after: Duration) -> Result<(Relation, Duration)> {
    // Each pass adds `stalled_max_age` to it.
    Error::check_max_durations([("dead_after", dead_after)])?;
    if dead_after < Duration::from_millis(30) {
        return Err(Error::InvalidOption {
            field: "dead_after",
            reason: "must be at least 30ms".to_owned(),
        });
    }
    Ok((Relation::parse("node_table", node_table)?, dead_after))
}

/// Periodically moves stalled `processing` rows back to `queued`, or to
/// `failed` once they were reset too often, in one atomic statement per pass.
///
/// Rows locked by a live transaction (a handler in transactional handling) are
/// never stalled. Several resetters on one table do not conflict: each pass
/// locks the rows it resets with `SKIP LOCKED`.
#[derive(Debug)]
pub struct Resetter {
    pool: PgPool,
    name: String,
    interval: Duration,
    connect_timeout: Duration,
    config: ResetConfig,
    table: Arc<Table>,
    /// Each pass's outcome, to [`subscribe`](Resetter::subscribe)rs.
    passes: broadcast::Sender<ResetOutcome>,
}

impl Resetter {
    /// A resetter for `table` (checked when it was built), checked now as
    /// [`check`](Self::check) says: the options, the server, the grants, the
    /// registry.
    pub async fn new(pool: &PgPool, table: &JobTable, options: ResetterOptions) -> Result<Self> {
        let config = options.resolve(table)?;
        let resetter = Resetter {
            pool: pool.clone(),
            name: options.name,
            interval: options.interval,
            connect_timeout: table.connect_timeout(),
            config,
            table: table.sql().clone(),
            passes: broadcast::channel(16).0,
        };
        resetter.check().await?;
        Ok(resetter)
    }

    /// Checks that the server answers, that the role may `UPDATE` the table
    /// (and, with workflows, what the release trigger touches when a reset
    /// fails a job), and, with a registry, that its table exists, naming
    /// each problem. [`new`](Self::new) runs it; run it again to re-check a
    /// resetter built long ago.
    pub async fn check(&self) -> Result<()> {
        crate::schema_check::probe_connection(&self.pool, self.connect_timeout).await?;
        let mut problems = Grants::new("resetting stalled jobs")
            .on_table(&self.table, &[Privilege::Update])
            .release_trigger(&self.table)
            // A job reset past its limit fails, freeing its key.
            .on_keys(&self.table, &[Privilege::Select, Privilege::Delete])
            .problems(&self.pool)
            .await?;
        if let Some((nodes, _)) = &self.config.dead_nodes {
            problems.extend(crate::cluster::nodes::problems(&self.pool, nodes).await?);
            // It reads the dead processes and prunes the long-dead rows.
            problems.extend(
                Grants::new("resetting the jobs of dead processes")
                    .on("node table", nodes, &[Privilege::Select, Privilege::Delete])
                    .problems(&self.pool)
                    .await?,
            );
        }
        crate::schema_check::none(problems)
    }

    /// Runs one pass now.
    pub async fn reset_once(&self) -> Result<ResetOutcome> {
        self.pass(None).await
    }

    /// Runs one pass now in a transaction fenced by `leadership`: nothing is
    /// written unless its term still holds the lease
    /// ([`Error::LeadershipLost`] otherwise).
    pub async fn reset_once_as_leader(&self, leadership: &Leadership) -> Result<ResetOutcome> {
        self.pass(Some(leadership)).await
    }

    async fn pass(&self, fence: Option<&Leadership>) -> Result<ResetOutcome> {
        let table = self.config.table.display_name();
        let started = std::time::Instant::now();
        let out = async {
            let mut tx = match fence {
                Some(leadership) => leadership.begin().await?,
                None => self.pool.begin().await.map_err(Error::db("begin"))?,
            };
            let out = reset_pass(&mut tx, &self.config).await?;
            tx.commit().await.map_err(Error::db("commit"))?;
            Ok::<_, Error>(out)
        };
        let out = out.await;
        metrics::histogram!(RESET_PASS_SECONDS, "table" => table.clone())
            .record(started.elapsed().as_secs_f64());
        let out = match out {
            Ok(out) => out,
            Err(err) => {
                metrics::counter!(RESET_ERRORS_TOTAL, "table" => table).increment(1);
                return Err(err);
            }
        };
        metrics::counter!(RESETS_TOTAL, "table" => table.clone()).increment(out.reset.len() as u64);
        metrics::counter!(RESET_FAILURES_TOTAL, "table" => table)
            .increment(out.failed.len() as u64);
        for (id, age) in &out.reset {
            tracing::warn!(resetter = %self.name, record_id = id, heartbeat_age = ?age, "requeued stalled job");
        }
        for id in &out.failed {
            tracing::error!(resetter = %self.name, record_id = id, "failed job that was reset too many times");
        }
        Ok(out)
    }

    /// Each pass's outcome from now on, as passes run (under
    /// [`Service::run`](crate::Service::run) or
    /// [`run_as_leader`](crate::Service::run_as_leader)): what was requeued and
    /// what was failed. A receiver that lags by more than 16 passes loses the
    /// oldest.
    pub fn subscribe(&self) -> broadcast::Receiver<ResetOutcome> {
        self.passes.subscribe()
    }

    async fn run_passes(&self, stop: &CancellationToken, fence: Option<&Leadership>) {
        Runner::every(self.interval)
            .backoff_up_to(self.interval.saturating_mul(4))
            .run(
                stop,
                &mut Passes {
                    resetter: self,
                    fence,
                },
            )
            .await;
    }
}

/// The resetter as the runner sees it: one reset pass per pass.
struct Passes<'a> {
    resetter: &'a Resetter,
    fence: Option<&'a Leadership>,
}

impl Pass for Passes<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("resetter", resetter = %self.resetter.name)
    }

    async fn pass(&mut self) -> Next {
        match self.resetter.pass(self.fence).await {
            Ok(out) => {
                // No subscriber is no error.
                let _ = self.resetter.passes.send(out);
                Next::Interval
            }
            Err(err) => {
                tracing::error!(resetter = %self.resetter.name, error = %err, "reset pass failed");
                Next::BackOff
            }
        }
    }
}

impl crate::Service for Resetter {
    fn name(&self) -> &str {
        "resetter"
    }

    /// Runs passes every interval until `stop` fires. A failed pass is
    /// logged and retried after a back-off: twice the interval, doubling with
    /// each failure in a row up to four intervals (stalled jobs wait for it,
    /// so it comes back soon once the database does). Each pass's outcome
    /// goes to [`Resetter::subscribe`]rs.
    async fn run(&self, stop: CancellationToken) -> crate::Result<()> {
        self.run_passes(&stop, None).await;
        Ok(())
    }

    /// [`run`](crate::Service::run) for a leader: every pass is fenced by the term (a
    /// pass after the term is over writes nothing), and the runs stop when
    /// leadership ends.
    async fn run_as_leader(&self, leadership: Leadership) -> crate::Result<()> {
        self.run_passes(&leadership.token(), Some(&leadership))
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead process's jobs are requeued only after its workers stopped
    /// them (their failure limit, and three heartbeat rounds to notice).
    #[test]
    fn the_default_rescue_waits_for_a_default_worker_to_stop_its_jobs() {
        let worker = workerutil::WorkerOptions::new("w");
        let limit = worker.heartbeat_failure_limit.expect("a default limit");
        let stopped = limit + worker.heartbeat_interval * 3;
        assert!(
            ResetterOptions::default().dead_after >= stopped,
            "{:?} < {stopped:?}",
            ResetterOptions::default().dead_after,
        );
    }
}
