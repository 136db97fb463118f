//! Operator actions on a job table, for the `dbworker` command line, the
//! dashboard and applications' own admin tools.
//!
#![doc = include_str!("../../docs/modules/admin.md")]

mod inputs;
mod replica;
mod running;
mod status;

use std::sync::Arc;

use sqlx::{PgPool, Row};
use workerutil::JobState;

use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
pub use crate::job_filter::{
    BulkAction, DEFAULT_FAIL_MESSAGE, FieldFilter, JobFilter, JobPage, JobSort, JobSummary,
    Matching, PageRequest, Reschedule, SEARCH_WINDOW, format_age,
};
use crate::sql::{self, Table};
use crate::table::JobTable;
pub use replica::{ReplicaLag, replica_lag};
pub use running::RunningJob;
pub use status::{FinishedCounts, QueueCounts, STATE_COLUMNS, Status};

/// A list row as a job's summary (`None` for a state this version does not know).
fn summary(r: &sqlx::postgres::PgRow) -> Option<JobSummary> {
    let state: String = r.get("state");
    Some(JobSummary {
        id: r.get("id"),
        state: state.parse().ok()?,
        queue: r.get("queue"),
        kind: r.get("kind"),
        num_failures: r.get("num_failures"),
        age_seconds: r.get("age"),
        worker_hostname: r.get("host"),
        failure_message: r.get("failure_message"),
        workflow_id: r.get("workflow_id"),
    })
}

/// A job table as an operator sees it.
#[derive(Debug, Clone)]
pub struct Admin {
    pool: PgPool,
    t: Arc<Table>,
}

/// What [`Admin::remove_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removed {
    /// The waiting (queued or errored) job holding the key was deleted.
    Deleted(i64),
    /// A processing job held the key: it runs on, but its key is freed and,
    /// with a retry-limit column, it will not be retried if it fails
    /// (graphile-worker's `remove_job` on a locked job).
    Processing(i64),
    /// No live job holds the key.
    NotFound,
}

/// What a search box suggests ([`Admin::suggestions`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Suggestions {
    /// Queues seen among the live jobs and the newest rows.
    pub queues: Vec<String>,
    /// Kinds seen likewise.
    pub kinds: Vec<String>,
}

/// What [`Admin::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Canceled {
    /// A waiting job is now `canceled`.
    Now,
    /// A processing job was asked to stop: its worker sees `cancel = true` at
    /// its next heartbeat and records it `canceled`.
    Requested,
    /// No live job with that id.
    NotLive,
}

impl Admin {
    /// An operator's view of `table` (checked when it was built). Reading
    /// (status, lists, a job's row) needs `SELECT` on the table and on what
    /// status reads beside it: the dependency table (with workflows), the
    /// pause and limit tables it honours and the progress table (a table
    /// that keeps progress there); every missing one is named at
    /// once. A tool that acts checks [`check_actions`](Self::check_actions)
    /// (and [`check_deletes`](Self::check_deletes)) at start-up.
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Admin> {
        let t = table.sql();
        let mut reads = Grants::new("reading the jobs (status, lists)")
            .on_table(t, &[Privilege::Select])
            .on_deps(t, &[Privilege::Select]);
        if let Some(pauses) = &t.pause_table {
            reads = reads.on("pause table", pauses, &[Privilege::Select]);
        }
        if let Some(limits) = &t.limit_table {
            reads = reads.on("limit table", limits, &[Privilege::Select]);
        }
        // A job's row and the running jobs show the progress kept there.
        if let Some(side) = &t.progress_table {
            reads = reads.on("progress table", side, &[Privilege::Select]);
        }
        reads.check(pool).await?;
        Ok(Admin {
            pool: pool.clone(),
            t: t.clone(),
        })
    }

    /// What a search box suggests: the values the queue and the kind columns
    /// take among up to 10,000 live jobs and the 1,000 newest rows (sorted,
    /// at most 200 each; empty without the column). Bounded by the partial
    /// indexes and the primary key, whatever the table's size.
    pub async fn suggestions(&self) -> Result<Suggestions> {
        let mut out = Suggestions::default();
        for (column, values) in [
            (&self.t.queue_column, &mut out.queues),
            (&self.t.kind_column, &mut out.kinds),
        ] {
            if let Some(column) = column {
                let rows = sql::suggest_values(&self.t, column)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(Error::db("suggestions"))?;
                *values = rows.iter().map(|r| r.get::<String, _>("v")).collect();
            }
        }
        Ok(out)
    }

    /// Checks the grants the actions other than deleting use: `UPDATE` on
    /// the table, with workflows what the release trigger touches when an
    /// action finishes or retries a job, and on a partitioned table with
    /// keys `SELECT, INSERT, DELETE` on its key table, and with the progress
    /// side table `SELECT, UPDATE` on it (a completion drops the checkpoint
    /// there). Each missing grant is named with its `GRANT`
    /// ([`Error::Access`]).
    pub async fn check_actions(&self) -> Result<()> {
        let mut grants = Grants::new("acting on jobs")
            .on_table(&self.t, &[Privilege::Update])
            .release_trigger(&self.t)
            // A requeue takes the job's key again, a cancel frees it.
            .on_keys(
                &self.t,
                &[Privilege::Select, Privilege::Insert, Privilege::Delete],
            );
        if let Some(side) = &self.t.progress_table {
            grants = grants.on(
                "progress table",
                side,
                &[Privilege::Select, Privilege::Update],
            );
        }
        grants.check(&self.pool).await
    }

    /// Checks the grants [`delete`](Self::delete), [`remove_key`](Self::remove_key)
    /// and a bulk delete use: `DELETE` on the table and, with workflows,
    /// what the release trigger does when an unfinished job goes (it cancels
    /// the job's dependents: `UPDATE` on the table too).
    pub async fn check_deletes(&self) -> Result<()> {
        let mut grants = Grants::new("deleting jobs")
            .on_table(&self.t, &[Privilege::Delete])
            .on_keys(&self.t, &[Privilege::Select, Privilege::Delete]);
        if self.t.workflows {
            grants = grants
                .on_table(&self.t, &[Privilege::Update])
                .release_trigger(&self.t);
        }
        grants.check(&self.pool).await
    }

    /// Checks the grants sending a signal ([`Signals`](crate::Signals))
    /// uses, as `dbworker signal` and the dashboard's signal form send it:
    /// `SELECT, UPDATE` on the table, `SELECT, INSERT` on its mailbox and
    /// `USAGE` on the mailbox's id sequence. Nothing on a table without
    /// signals.
    pub async fn check_signals(&self) -> Result<()> {
        Grants::signal_sender(&self.t).check(&self.pool).await
    }

    /// An action this admin can apply: a reschedule's priority or retry
    /// limit needs its column, and one run-at at most.
    fn check_action(&self, action: &BulkAction) -> Result<()> {
        let BulkAction::Reschedule(r) = action else {
            return Ok(());
        };
        for (wanted, column, field) in [
            (r.priority.is_some(), &self.t.priority_column, "priority"),
            (
                r.max_retries.is_some(),
                &self.t.max_retries_column,
                "max_retries",
            ),
        ] {
            if wanted && column.is_none() {
                return Err(Error::InvalidOption {
                    field,
                    reason: format!(
                        "rescheduling with a {field} needs the table's {field}_column (JobTableOptions::{field}_column)"
                    ),
                });
            }
        }
        // A negative count would be stored as given: what would -3 failures mean?
        for (value, field) in [
            (r.num_failures, "num_failures"),
            (r.max_retries, "max_retries"),
        ] {
            if let Some(n) = value.filter(|n| *n < 0) {
                return Err(Error::InvalidOption {
                    field,
                    reason: format!("{n} is negative; it must be 0 or more"),
                });
            }
        }
        if r.run_at.is_some() && r.run_after.is_some() {
            return Err(Error::InvalidOption {
                field: "run_at",
                reason: "give run_at or run_after, not both".into(),
            });
        }
        Ok(())
    }

    /// A filter this admin can apply: a queue or kind needs its column.
    fn check(&self, filter: &JobFilter) -> Result<()> {
        for (wanted, column, field) in [
            (&filter.queue, &self.t.queue_column, "queue"),
            (&filter.kind, &self.t.kind_column, "kind"),
        ] {
            if wanted.is_some() && column.is_none() {
                return Err(Error::InvalidOption {
                    field,
                    reason: format!("filtering by {field} needs the table's {field} column"),
                });
            }
        }
        if filter.workflow_id.is_some() && !self.t.workflows {
            return Err(Error::InvalidOption {
                field: "workflow_id",
                reason: "filtering by workflow needs a table with workflows (JobTableOptions::workflows; migrated with --workflows)".into(),
            });
        }
        Ok(())
    }

    /// A page of jobs matching `filter`, in `page`'s order. By id with a
    /// failure-text or field filter (no index serves those), the page looks
    /// at no more than [`PageRequest::search_window`] rows below its cursor;
    /// if it stops there, [`JobPage::searched`] says so and `next` is where
    /// it stopped: the next page continues there, skipping or repeating no
    /// match.
    pub async fn list(&self, filter: &JobFilter, page: PageRequest) -> Result<JobPage> {
        self.check(filter)?;
        if page.sort != JobSort::Id && page.after.is_some() != page.after_value.is_some() {
            return Err(Error::InvalidOption {
                field: "after_value",
                reason: "a sorted page needs both `after` and `after_value`".into(),
            });
        }
        inputs::check_fields(&self.pool, &self.t.table, &filter.fields).await?;
        let window = page.search_window;
        if page.sort == JobSort::Id
            && window > 0
            && (filter.failure_contains.is_some() || !filter.fields.is_empty())
        {
            return self.search(filter, &page, window).await;
        }
        let rows = sql::admin_list(&self.t, filter, &page)
            .fetch_all(&self.pool)
            .await
            .map_err(|err| inputs::list_error(&page, err))?;
        let jobs: Vec<JobSummary> = rows.iter().filter_map(summary).collect();
        let full = rows.len() == page.size as usize && page.size > 0;
        let last = rows.last().filter(|_| full);
        Ok(JobPage {
            jobs,
            next: last.map(|r| r.get("id")),
            next_value: last.and_then(|r| r.get("sort_value")),
            searched: None,
        })
    }

    /// A page by id looking at no more than `window` rows below the cursor
    /// (the filter has a condition no index serves).
    async fn search(&self, filter: &JobFilter, page: &PageRequest, window: u32) -> Result<JobPage> {
        let rows = sql::admin_list_window(&self.t, filter, page, window)
            .fetch_all(&self.pool)
            .await
            .map_err(|err| inputs::list_error(page, err))?;
        // The window's last row comes back matching or not: it was full.
        let edge = rows
            .iter()
            .find(|r| r.get::<i64, _>("n") == i64::from(window))
            .map(|r| r.get::<i64, _>("id"));
        let jobs: Vec<JobSummary> = rows
            .iter()
            .filter(|r| r.get::<bool, _>("matched"))
            .filter_map(summary)
            .collect();
        let full = jobs.len() == page.size as usize && page.size > 0;
        let (next, searched) = match (jobs.last().filter(|_| full), edge) {
            (Some(last), _) => (Some(last.id), None),
            (None, Some(edge)) => (Some(edge), Some(window)),
            (None, None) => (None, None),
        };
        Ok(JobPage {
            jobs,
            next,
            next_value: None,
            searched,
        })
    }

    /// How many jobs `action` would act on among those matching `filter`.
    /// A filter naming a state the action never touches is refused.
    pub async fn count_matching(&self, filter: &JobFilter, action: &BulkAction) -> Result<u64> {
        Ok(self.matching(filter, action).await?.count)
    }

    /// How many jobs `action` would act on among those matching `filter`, and
    /// the highest id among them: set it as the filter's
    /// [`max_id`](JobFilter::max_id) when the operator confirms, so
    /// [`act_on_matching`](Self::act_on_matching) leaves alone the jobs
    /// enqueued since.
    pub async fn matching(&self, filter: &JobFilter, action: &BulkAction) -> Result<Matching> {
        self.check(filter)?;
        self.check_action(action)?;
        action.check_states(filter)?;
        inputs::check_fields(&self.pool, &self.t.table, &filter.fields).await?;
        let row = sql::admin_count(&self.t, filter, action.states())
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db("count"))?;
        Ok(Matching {
            count: u64::try_from(row.get::<i64, _>("count")).unwrap_or(0),
            max_id: row.get("max_id"),
        })
    }

    /// Applies `action` to every job matching `filter` (and in a state the
    /// action may touch), `chunk_size` jobs per short statement, in id order;
    /// `on_batch` gets the jobs acted on so far after each batch. Returns how
    /// many it acted on: jobs that changed state in between are left alone.
    /// Without [`JobFilter::max_id`] it also acts on jobs enqueued while it
    /// runs; after a confirmation, bound it by [`matching`](Self::matching).
    /// A filter naming a state the action never touches is refused.
    pub async fn act_on_matching(
        &self,
        filter: &JobFilter,
        action: &BulkAction,
        chunk_size: u32,
        mut on_batch: impl FnMut(u64),
    ) -> Result<u64> {
        self.check(filter)?;
        self.check_action(action)?;
        action.check_states(filter)?;
        inputs::check_fields(&self.pool, &self.t.table, &filter.fields).await?;
        if chunk_size == 0 {
            return Err(Error::InvalidOption {
                field: "chunk_size",
                reason: "must be at least 1".into(),
            });
        }
        let (mut after, mut done) = (0i64, 0u64);
        loop {
            let ids: Vec<i64> =
                sql::admin_select_ids(&self.t, filter, action.states(), after, chunk_size)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(Error::db("select"))?
                    .iter()
                    .map(|r| r.get("id"))
                    .collect();
            let Some(&last) = ids.last() else {
                return Ok(done);
            };
            done += self.act_on(&ids, action).await?;
            on_batch(done);
            after = last;
        }
    }

    /// Applies `action` to the jobs among `ids` that are in a state it may
    /// touch (checked on each row); returns how many it acted on.
    pub async fn act_on_ids(&self, ids: &[i64], action: &BulkAction) -> Result<u64> {
        self.check_action(action)?;
        self.act_on(ids, action).await
    }

    /// Applies `action` to the jobs among `ids` in a state it may touch.
    async fn act_on(&self, ids: &[i64], action: &BulkAction) -> Result<u64> {
        let op = action.verb();
        Ok(match action {
            BulkAction::Requeue => {
                let requeue = sql::admin_requeue(&self.t, ids);
                self.act_on_waiting(ids, action, requeue, op).await?
            }
            BulkAction::Fail(message) => {
                self.act(sql::admin_fail(&self.t, ids, message), op).await?
            }
            BulkAction::Delete => self.act(sql::admin_delete(&self.t, ids), op).await?,
            BulkAction::Complete => self.act(sql::admin_complete(&self.t, ids), op).await?,
            BulkAction::Reschedule(r) => {
                let reschedule = sql::admin_reschedule(&self.t, ids, r);
                self.act_on_waiting(ids, action, reschedule, op).await?
            }
            BulkAction::Cancel => {
                self.act(sql::admin_cancel_waiting(&self.t, ids), op)
                    .await?
                    + self
                        .act(sql::admin_request_cancel(&self.t, ids), op)
                        .await?
            }
        })
    }

    /// Jobs completed, failed and canceled in the last `window`, per state
    /// (database clock; cheap with the index on `finished_at` that
    /// `dbworker migration --retention` adds).
    pub async fn recent(&self, window: std::time::Duration) -> Result<Vec<(JobState, u64)>> {
        let rows = sql::admin_recent(&self.t, window)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("recent"))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let state: String = r.get("state");
                let n: i64 = r.get("count");
                Some((state.parse().ok()?, u64::try_from(n).unwrap_or(0)))
            })
            .collect())
    }

    /// The queue column, if the admin knows one.
    pub fn queue_column(&self) -> Option<&str> {
        self.t.queue_column.as_deref()
    }

    /// The kind column, if the admin knows one.
    pub fn kind_column(&self) -> Option<&str> {
        self.t.kind_column.as_deref()
    }

    /// The job's row as JSON (every column; on a table that keeps progress
    /// in its side table, its `progress` too), or `None`.
    pub async fn show(&self, id: i64) -> Result<Option<serde_json::Value>> {
        Ok(self.show_at(id).await?.map(|(row, _)| row))
    }

    /// The job's row, and the database clock's now (seconds since the epoch).
    pub(crate) async fn show_at(&self, id: i64) -> Result<Option<(serde_json::Value, f64)>> {
        let row = sql::admin_show(&self.t, id)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("show"))?;
        Ok(row.map(|r| (r.get("row"), r.get("now"))))
    }

    /// The resolved table (the dashboard's job page reads its optional columns).
    #[cfg(feature = "dashboard")]
    pub(crate) fn table(&self) -> &Table {
        &self.t
    }

    /// Puts a failed, canceled or errored job back in the queue, to run now;
    /// its failure count starts again (a workflow's dependent that still
    /// waits for an upstream job goes back to `pending`). Returns whether it
    /// did.
    pub async fn requeue(&self, id: i64) -> Result<bool> {
        let requeue = sql::admin_requeue(&self.t, &[id]);
        Ok(self
            .act_on_waiting(&[id], &BulkAction::Requeue, requeue, "requeue")
            .await?
            == 1)
    }

    /// Cancels a job: a waiting one at once, a processing one through its worker.
    pub async fn cancel(&self, id: i64) -> Result<Canceled> {
        if self
            .act(sql::admin_cancel_waiting(&self.t, &[id]), "cancel")
            .await?
            == 1
        {
            return Ok(Canceled::Now);
        }
        if self
            .act(sql::admin_request_cancel(&self.t, &[id]), "cancel")
            .await?
            == 1
        {
            return Ok(Canceled::Requested);
        }
        Ok(Canceled::NotLive)
    }

    /// Fails a waiting (queued or errored) job with `message`. Returns whether it did.
    pub async fn fail(&self, id: i64, message: &str) -> Result<bool> {
        Ok(self
            .act(sql::admin_fail(&self.t, &[id], message), "fail")
            .await?
            == 1)
    }

    /// Deletes a job that is not processing. Returns whether it did.
    pub async fn delete(&self, id: i64) -> Result<bool> {
        Ok(self
            .act(sql::admin_delete(&self.t, &[id]), "delete")
            .await?
            == 1)
    }

    /// Deletes the waiting (queued or errored) job holding `key` (needs
    /// `JobTableOptions::key_column`). A processing holder runs on, but its
    /// key is freed (set NULL) and, with a retry-limit column, its retries
    /// are ended; it is reported as [`Removed::Processing`].
    pub async fn remove_key(&self, key: &str) -> Result<Removed> {
        if self.t.key_column.is_none() {
            return Err(Error::InvalidOption {
                field: "key_column",
                reason: "removing a job by key needs the table's key_column (JobTableOptions::key_column)".into(),
            });
        }
        let gone = sql::admin_remove_key(&self.t, key)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("remove"))?;
        if let Some(row) = gone {
            return Ok(Removed::Deleted(row.get("id")));
        }
        let holder = sql::release_key(&self.t, key)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("remove"))?;
        Ok(match holder {
            Some(row) => Removed::Processing(row.get("id")),
            None => Removed::NotFound,
        })
    }

    /// Runs a requeue or a reschedule (`statement`, of `action` on `ids`);
    /// on a table with workflows after locking the upstream jobs the moved
    /// jobs still wait for, in one transaction (see `sql::lock_waited_for`).
    async fn act_on_waiting(
        &self,
        ids: &[i64],
        action: &BulkAction,
        statement: sql::Statement,
        op: &'static str,
    ) -> Result<u64> {
        if !self.t.workflows {
            return self.act(statement, op).await;
        }
        let mut tx = self.pool.begin().await.map_err(Error::db(op))?;
        sql::lock_waited_for(&self.t, ids, action.states())
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
        let done = statement.execute(&mut *tx).await.map_err(Error::db(op))?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(done.rows_affected())
    }

    async fn act(&self, statement: sql::Statement, op: &'static str) -> Result<u64> {
        let done = statement.execute(&self.pool).await.map_err(Error::db(op))?;
        Ok(done.rows_affected())
    }
}
