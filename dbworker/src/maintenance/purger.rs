//! Retention: deletes (or archives) finished rows older than a per-state age,
//! in small batches, in a worker process or alone (`dbworker purge`). On a
//! partitioned table it first drops whole partitions whose every row is
//! purgeable, and keeps partitions created ahead.

use std::sync::Arc;
use std::sync::{Mutex, PoisonError};

use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;
use workerutil::JobState;

use crate::cluster::Leadership;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::metrics::PURGED_TOTAL;
use crate::runner::{Next, Pass, Runner};
use crate::sql::{self, Table};
use crate::table::JobTable;

use super::partitions::{self, DroppedPartition};
use super::purge_options::PurgeOptions;

/// The table a purger works on, and where its rows go.
#[derive(Debug, Clone)]
pub(crate) struct PurgeTarget {
    pub(crate) t: Arc<Table>,
    /// Checked at start-up, with the columns it takes.
    pub(crate) archive: Option<sql::Archive>,
    /// The history whose records a row must be in before it goes.
    pub(crate) history: Option<sql::RecordedBy>,
}

impl std::ops::Deref for PurgeTarget {
    type Target = Table;

    fn deref(&self) -> &Table {
        &self.t
    }
}

/// The operation named when `partitions create` gives up on the job table's
/// lock.
const CREATE_LOCK_NOT_GRANTED: &str = "create_partitions (the job table's lock was not granted within detach_lock_timeout: a transaction holds the table; try again once it ends)";

/// The operation named when a leader's batch outlasts a third of its lease.
const BATCH_OVER_LEASE: &str = "purge (a batch took over a third of the leader's lease and was cut off: add the retention index, `dbworker migration --retention`, or lower chunk_size)";

/// Deletes or archives old finished rows of one job table.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use std::time::Duration;
/// use dbworker::maintenance::{PurgeOptions, Purger};
/// use dbworker::{JobTable, JobTableOptions};
/// let jobs = JobTable::new(&pool, JobTableOptions::new("email_jobs")).await?;
/// let mut options = PurgeOptions::new();
/// options.max_age = vec![(workerutil::JobState::Completed, Duration::from_secs(3600))];
/// let purger = Purger::new(&pool, &jobs, options).await?;
/// let purged = purger.purge_once().await?;
/// println!("purged {}", purged.total());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Purger {
    pool: PgPool,
    options: PurgeOptions,
    target: PurgeTarget,
    partitioned: bool,
    /// Where each pass's look for orphaned side rows starts: the progress
    /// table's, then the mailbox's (shared by clones); `None`: at a random
    /// key. `None` for both tables when row-level security may hide jobs
    /// from this role (no sweep: a hidden job would look deleted).
    sweeps: Option<Arc<Mutex<[Option<i64>; 2]>>>,
}

/// What one pass purged, per state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Rows deleted (or archived) in batches, by state.
    pub by_state: Vec<(JobState, u64)>,
    /// Partitions dropped whole (partitioned tables), oldest first.
    pub partitions_dropped: Vec<DroppedPartition>,
    /// Partitions created ahead (partitioned tables).
    pub partitions_created: Vec<String>,
    /// Progress side rows and mailbox rows of jobs that no longer exist
    /// (deleted by plain SQL, or in a dropped partition), deleted in this
    /// pass's window (not counted in [`total`](Self::total)).
    pub orphans: u64,
}

impl Purged {
    /// Rows purged in all, in batches and with dropped partitions.
    pub fn total(&self) -> u64 {
        self.by_state.iter().map(|(_, n)| n).sum::<u64>()
            + self.partitions_dropped.iter().map(|p| p.rows).sum::<u64>()
    }
}

impl Purger {
    /// A purger of `table` (checked when it was built): validates the
    /// options and checks the archive table (every column of the job table
    /// must be in it: rows are copied by column name), the grants purging uses
    /// (`UPDATE, DELETE` on the table, `INSERT` on the archive) and, on a partitioned
    /// table, its partition function.
    pub async fn new(pool: &PgPool, table: &JobTable, options: PurgeOptions) -> Result<Purger> {
        let pool = pool.clone();
        let history = match &options.history {
            Some(h) => Some(sql::RecordedBy {
                history: h.relation()?,
                job_table: table.name(),
                catch_up: h.catch_up,
            }),
            None => None,
        };
        let archive_table = options.archive()?;
        let mut target = PurgeTarget {
            t: table.sql().clone(),
            archive: None,
            history,
        };
        // Each batch locks its rows (FOR UPDATE SKIP LOCKED) before deleting
        // them, and a row lock needs UPDATE.
        // With workflows, deleting a failed or canceled job others waited for
        // runs the release trigger as the purger: it cancels their dependents
        // for good and deletes the edges.
        let mut grants = Grants::new("purging")
            .on_table(&target.t, &[Privilege::Update, Privilege::Delete])
            .on_deps(
                &target.t,
                &[Privilege::Select, Privilege::Update, Privilege::Delete],
            );
        if let Some(archive) = &archive_table {
            grants = grants.on("archive table", archive, &[Privilege::Insert]);
        }
        // The purged jobs' signals go with them (the delete's subquery reads).
        if let Some(mailbox) = &target.t.signals {
            grants = grants.on(
                "signal mailbox",
                mailbox,
                &[Privilege::Select, Privilege::Delete],
            );
        }
        // And their progress kept in the side table.
        if let Some(side) = &target.t.progress_table {
            grants = grants.on(
                "progress table",
                side,
                &[Privilege::Select, Privilege::Delete],
            );
        }
        // Where the history's records end.
        if let Some(h) = &target.history {
            grants = grants.on("history table", &h.history, &[Privilege::Select]);
        }
        let mut problems = grants.problems(&pool).await?;
        if let Some(h) = &target.history {
            problems.extend(
                crate::schema_check::missing_columns(
                    &pool,
                    &h.history,
                    "history table",
                    &["job_table", "bucket", "seconds"],
                    "`dbworker migration --history` prints it",
                )
                .await?,
            );
        }
        if let Some(table) = archive_table {
            let (archive, found) = super::archive::check(&pool, &target.t, table).await?;
            problems.extend(found);
            target.archive = Some(archive);
        }
        let partitioned = crate::schema_check::is_partitioned(&pool, &target.table).await?;
        if partitioned && !partitions::has_create_function(&pool, &target.table).await? {
            problems.push(format!(
                "partitioned table {} has no function {}_create_partitions (`dbworker migration --partitioned` prints it)",
                target.table.display_name(),
                target.table.name
            ));
        }
        crate::schema_check::none(problems)?;
        let sweeps = if target.t.progress_table.is_none() && target.t.signals.is_none() {
            None
        } else if sql::row_security_hides_jobs(&target.t)
            .fetch_optional(&pool)
            .await
            .map_err(Error::db("row security check"))?
            .and_then(|row| row.get::<Option<bool>, _>("hides"))
            .unwrap_or(false)
        {
            tracing::warn!(table = %target.table.display_name(),
                "row-level security may hide jobs from the purger's role: side rows of jobs deleted other ways are left alone");
            None
        } else {
            Some(Arc::default())
        };
        Ok(Purger {
            pool,
            options,
            target,
            partitioned,
            sweeps,
        })
    }

    /// Whether the job table is partitioned (checked by [`Purger::new`]).
    pub fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    /// On a partitioned table, creates the partitions `partitions_ahead`
    /// intervals ahead (what `dbworker partitions create` runs); returns the
    /// names of those created. Nothing on a plain table. The job table's lock
    /// is awaited at most `detach_lock_timeout`: past it, an error says the
    /// lock was not granted and nothing is created.
    pub async fn create_partitions(&self) -> Result<Vec<String>> {
        self.create_ahead(None)
            .await?
            .map_err(Error::db(CREATE_LOCK_NOT_GRANTED))
    }

    async fn create_ahead(
        &self,
        fence: Option<&Leadership>,
    ) -> Result<std::result::Result<Vec<String>, sqlx::Error>> {
        if !self.partitioned {
            return Ok(Ok(Vec::new()));
        }
        partitions::create_ahead(
            &self.pool,
            &self.target.table,
            self.options.partitions_ahead,
            self.options.detach_lock_timeout,
            fence,
        )
        .await
    }

    /// Purges every configured state until none is left that old. On a
    /// partitioned table it first creates partitions ahead and drops whole
    /// partitions whose every row is purgeable; the rest (the default
    /// partition, partitions still holding a live job) goes in batches.
    pub async fn purge_once(&self) -> Result<Purged> {
        self.purge(None).await
    }

    /// [`purge_once`](Self::purge_once) for a leader: each batch, each
    /// partition created and each partition dropped is written in a
    /// transaction fenced by the term, so nothing is deleted, created or
    /// dropped once the term is over: the pass ends with
    /// [`Error::LeadershipLost`]. A partition's creation and detach each
    /// wait at most `detach_lock_timeout` inside the fenced transaction (which
    /// holds up this node's renewals meanwhile), and archiving a partition
    /// copies it there too: keep both short beside the lease. A batch is cut
    /// off past a third of the lease (`statement_timeout`), failing the pass
    /// with an error that says so, rather than deposing the leader.
    pub async fn purge_once_as_leader(&self, leadership: &Leadership) -> Result<Purged> {
        self.purge(Some(leadership)).await
    }

    async fn purge(&self, fence: Option<&Leadership>) -> Result<Purged> {
        let mut purged = Purged::default();
        if self.partitioned {
            purged.partitions_created = match self.create_ahead(fence).await? {
                Ok(created) => created,
                Err(_) => {
                    // Warned: on a table always held by a long transaction the
                    // partitions ahead run out, and new jobs land in the default.
                    tracing::warn!(table = %self.target.table.display_name(), "partitions ahead not created: the job table's lock was not granted within detach_lock_timeout; tried again next pass (if this repeats, raise detach_lock_timeout or shorten the transactions holding the table)");
                    Vec::new()
                }
            };
            purged.partitions_dropped = partitions::drop_purgeable(
                &self.pool,
                &self.target,
                &self.options.max_age,
                self.options.detach_lock_timeout,
                fence,
            )
            .await?;
        }
        for &(state, age) in &self.options.max_age {
            let mut n: u64 = 0;
            loop {
                let batch = sql::purge_batch(
                    &self.target,
                    self.target.archive.as_ref(),
                    self.target.history.as_ref(),
                    state,
                    age,
                    self.options.chunk_size,
                );
                let rows = match fence {
                    None => batch.fetch_all(&self.pool).await,
                    Some(leadership) => {
                        let mut tx = leadership.begin().await?;
                        // The leader's renewals wait for this transaction: a
                        // third of the lease leaves them time to confirm.
                        sql::set_statement_timeout(leadership.lease() / 3)
                            .execute(&mut *tx)
                            .await
                            .map_err(Error::db("purge"))?;
                        let rows = batch.fetch_all(&mut *tx).await;
                        if rows.is_ok() {
                            tx.commit().await.map_err(Error::db("commit"))?;
                        }
                        rows
                    }
                }
                .map_err(|err| match fence {
                    // query_canceled: the statement timeout above.
                    Some(_) if crate::error::has_sqlstate(&err, "57014") => {
                        Error::db(BATCH_OVER_LEASE)(err)
                    }
                    _ => Error::db("purge")(err),
                })?;
                let count = rows.len() as u64;
                n += count;
                if count < u64::from(self.options.chunk_size) {
                    break;
                }
            }
            metrics::counter!(
                PURGED_TOTAL,
                "table" => self.target.table.display_name(),
                "state" => state.as_str()
            )
            .increment(n);
            if n > 0 {
                tracing::info!(table = %self.target.table.display_name(), state = state.as_str(), rows = n, "purged");
            }
            purged.by_state.push((state, n));
        }
        purged.orphans = self.sweep_orphans(fence).await?;
        Ok(purged)
    }

    /// Deletes the side rows (progress, mailbox) of jobs gone other ways
    /// than through this purger, in a window of `10 × chunk_size` rows per
    /// table and pass that moves on each pass and wraps at the end (a new
    /// purger starts at a random key).
    async fn sweep_orphans(&self, fence: Option<&Leadership>) -> Result<u64> {
        let Some(sweeps) = &self.sweeps else {
            return Ok(0);
        };
        let sides = [
            (self.target.t.progress_table.as_ref(), "job_id"),
            (self.target.t.signals.as_ref(), "id"),
        ];
        let window = self.options.chunk_size.saturating_mul(10);
        let mut deleted = 0;
        for (n, (side, key)) in sides.into_iter().enumerate() {
            let Some(side) = side else { continue };
            let after = sweeps.lock().unwrap_or_else(PoisonError::into_inner)[n];
            let sweep = sql::sweep_orphans(&self.target, side, key, after, window);
            let row = match fence {
                None => sweep.fetch_one(&self.pool).await,
                Some(leadership) => {
                    let mut tx = leadership.begin().await?;
                    let row = sweep.fetch_one(&mut *tx).await;
                    if row.is_ok() {
                        tx.commit().await.map_err(Error::db("commit"))?;
                    }
                    row
                }
            }
            .map_err(Error::db("sweep orphaned side rows"))?;
            let looked: i64 = row.get("looked");
            // A short window reached the end: the next pass starts over.
            let next = match row.get::<Option<i64>, _>("last") {
                Some(last) if looked >= i64::from(window) => last,
                _ => i64::MIN,
            };
            sweeps.lock().unwrap_or_else(PoisonError::into_inner)[n] = Some(next);
            let gone = u64::try_from(row.get::<i64, _>("deleted")).unwrap_or(0);
            if gone > 0 {
                tracing::info!(table = %side.display_name(), rows = gone, "deleted the side rows of jobs that no longer exist");
            }
            deleted += gone;
        }
        Ok(deleted)
    }
    async fn run_passes(&self, stop: &CancellationToken, fence: Option<&Leadership>) {
        let interval = self.options.interval;
        // Jitter: processes deployed together would otherwise purge in step.
        // Retention is never urgent, so a failing database is left alone long.
        Runner::every(interval)
            .jitter(0.1)
            .backoff_up_to(interval.saturating_mul(8))
            .run(
                stop,
                &mut Passes {
                    purger: self,
                    fence,
                },
            )
            .await;
    }
}

/// The purger as the runner sees it: one [`Purger::purge`] per pass.
struct Passes<'a> {
    purger: &'a Purger,
    fence: Option<&'a Leadership>,
}

impl Pass for Passes<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("purger", table = %self.purger.target.table.display_name())
    }

    async fn pass(&mut self) -> Next {
        match self.purger.purge(self.fence).await {
            Ok(_) => Next::Interval,
            Err(err) => {
                tracing::error!(table = %self.purger.target.table.display_name(), error = %err, "purge pass failed");
                Next::BackOff
            }
        }
    }
}

impl crate::Service for Purger {
    fn name(&self) -> &str {
        "purger"
    }

    /// Purges every `interval` (±10 %) until `stop` fires. A failed pass is
    /// logged and retried after a back-off: twice the interval, doubling with
    /// each failure in a row up to eight intervals.
    async fn run(&self, stop: CancellationToken) -> crate::Result<()> {
        self.run_passes(&stop, None).await;
        Ok(())
    }

    /// [`run`](crate::Service::run) for a leader: every write fenced by the term (see
    /// [`Purger::purge_once_as_leader`]); stops when leadership ends.
    async fn run_as_leader(&self, leadership: Leadership) -> crate::Result<()> {
        self.run_passes(&leadership.token(), Some(&leadership))
            .await;
        Ok(())
    }
}
