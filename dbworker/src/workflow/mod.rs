//! Workflows: jobs that wait for other jobs (graphs of named tasks), and
//! batches of jobs with callbacks.
//!
#![doc = include_str!("../../docs/modules/workflow.md")]

mod batch;
mod builder;
mod graph;
mod list;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqlx::{PgConnection, PgPool, Row};

use crate::enqueue::Enqueuer;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql::{self, Table};
use crate::table::JobTable;
pub use batch::{Batch, BatchCounts, Batches, EnqueuedBatch};
pub use builder::{EnqueuedWorkflow, Task, Workflow};
pub use graph::{GraphTask, WorkflowGraph};
pub use list::{WorkflowFilter, WorkflowList, WorkflowListRequest, WorkflowState, WorkflowSummary};

/// Enqueues workflows into a job table with workflows (`dbworker migration
/// --workflows`), cancels them, and reports their status.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::NewJob;
/// use dbworker::{JobTable, JobTableOptions};
/// use dbworker::workflow::{Task, Workflow, Workflows};
/// let mut options = JobTableOptions::new("jobs");
/// options.workflows = true;
/// let jobs = JobTable::new(&pool, options).await?;
/// let workflows = Workflows::new(&pool, &jobs).await?;
/// let enqueued = workflows
///     .enqueue(
///         &Workflow::new()
///             .task(Task::new("fetch", NewJob::new()))
///             .task(Task::new("report", NewJob::new()).after(["fetch"])),
///     )
///     .await?;
/// let status = workflows.status(enqueued.id).await?;
/// # let _ = status; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Workflows {
    pool: PgPool,
    enqueuer: Enqueuer,
    table: Arc<Table>,
}

/// What [`Workflows::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WorkflowCanceled {
    /// Waiting tasks (pending, queued, errored) canceled at once.
    pub canceled: u64,
    /// Running tasks whose workers were asked to cancel them.
    pub requested: u64,
}

/// One task of a workflow, from [`Workflows::status`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TaskStatus {
    /// The task's job id.
    pub id: i64,
    /// The task's name.
    pub name: String,
    /// The job's state (`pending` while it waits).
    pub state: String,
    /// When its last attempt started (database clock).
    pub started_at: Option<SystemTime>,
    /// When it finished (database clock).
    pub finished_at: Option<SystemTime>,
    /// The tasks it still waits for, by name (an upstream job outside the
    /// workflow by its id, `#17`).
    pub waits_on: Vec<String>,
    /// The upstream job whose failure canceled it; a retry of that job brings
    /// this one back.
    pub blocked_by: Option<i64>,
}

/// A workflow's state, from [`Workflows::status`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkflowStatus {
    /// The workflow's id.
    pub id: i64,
    /// Tasks per state.
    pub counts: BTreeMap<String, u64>,
    /// Every task, in id order (an upstream before its dependents).
    pub tasks: Vec<TaskStatus>,
}

impl WorkflowStatus {
    /// Whether every task is in a final state.
    pub fn is_finished(&self) -> bool {
        self.tasks
            .iter()
            .all(|t| matches!(t.state.as_str(), "completed" | "failed" | "canceled"))
    }
}

impl Workflows {
    /// Workflows in `table`, which must have them (`JobTableOptions::workflows`;
    /// its workflow columns and dependency table were checked when it was built).
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<Workflows> {
        if !table.has_workflows() {
            return Err(Error::InvalidOption {
                field: "workflows",
                reason: format!(
                    "table {} has no workflows: set JobTableOptions::workflows (`dbworker migration --workflows` adds what they need)",
                    table.name()
                ),
            });
        }
        let enqueuer = Enqueuer::new(pool, table).await?;
        let t = table.sql();
        Grants::new("enqueueing workflows")
            .on_table(t, &[Privilege::Update])
            .on_deps(t, &[Privilege::Insert])
            .workflow_sequence(t)
            .release_trigger(t)
            .check(pool)
            .await?;
        let table = t.clone();
        Ok(Workflows {
            pool: pool.clone(),
            enqueuer,
            table,
        })
    }

    /// Workflows in `table` for reading only (their status and graph), as
    /// the dashboard shows them: no grant beyond `SELECT` is checked, so
    /// enqueueing through it fails on the first statement a role may not run.
    #[cfg(feature = "dashboard")]
    pub(crate) fn reader(pool: &PgPool, table: &JobTable) -> Workflows {
        Workflows {
            pool: pool.clone(),
            enqueuer: Enqueuer::unchecked(pool, table),
            table: table.sql().clone(),
        }
    }

    /// The enqueuer over the same table (with workflows on), for
    /// [`NewJob::after`](crate::NewJob::after) and plain jobs.
    pub fn enqueuer(&self) -> &Enqueuer {
        &self.enqueuer
    }

    /// Enqueues `workflow` on the pool, all or nothing; see
    /// [`enqueue_in`](Self::enqueue_in).
    pub async fn enqueue(&self, workflow: &Workflow) -> Result<EnqueuedWorkflow> {
        let mut conn = self.pool.acquire().await.map_err(Error::db("acquire"))?;
        self.enqueue_in(&mut conn, workflow).await
    }

    /// Enqueues `workflow` on the caller's connection or inside its
    /// transaction (a savepoint there), all or nothing: the graph is checked
    /// first (see [`Workflow::check`]), then every task is inserted, `queued`
    /// if it waits for nothing and `pending` otherwise, with its edges.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        workflow: &Workflow,
    ) -> Result<EnqueuedWorkflow> {
        let graph = workflow.graph()?;
        let (id, ids) = self.enqueuer.insert_graph(conn, &graph).await?;
        Ok(EnqueuedWorkflow {
            id,
            ids: graph
                .iter()
                .zip(ids)
                .map(|(t, id)| (t.name.to_owned(), id))
                .collect(),
        })
    }

    /// Cancels a workflow: its waiting tasks at once, its running ones
    /// through their workers (as [`Admin::cancel`](crate::admin::Admin::cancel)
    /// does). Jobs outside it that wait for its tasks follow their policies.
    pub async fn cancel(&self, workflow_id: i64) -> Result<WorkflowCanceled> {
        let mut tx = self.pool.begin().await.map_err(Error::db("begin"))?;
        let canceled = sql::workflow_cancel_waiting(&self.table, workflow_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("workflow_cancel"))?
            .rows_affected();
        let requested = sql::workflow_request_cancel(&self.table, workflow_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("workflow_cancel"))?
            .rows_affected();
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(WorkflowCanceled {
            canceled,
            requested,
        })
    }

    /// A workflow's tasks, their states and what each still waits for;
    /// `None` if no job has this workflow id.
    pub async fn status(&self, workflow_id: i64) -> Result<Option<WorkflowStatus>> {
        let rows = sql::workflow_tasks(&self.table, workflow_id)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("workflow_status"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let names: HashMap<i64, String> = rows
            .iter()
            .map(|r| {
                let name: Option<String> = r.get("task_name");
                (r.get("id"), name.unwrap_or_default())
            })
            .collect();
        let time = |secs: Option<f64>| {
            secs.and_then(|s| Duration::try_from_secs_f64(s).ok())
                .map(|d| SystemTime::UNIX_EPOCH + d)
        };
        let mut counts = BTreeMap::new();
        let mut tasks = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.get("state");
            *counts.entry(state.clone()).or_insert(0) += 1;
            let waits_on: Vec<i64> = r.get("waits_on");
            let id: i64 = r.get("id");
            tasks.push(TaskStatus {
                id,
                name: names[&id].clone(),
                state,
                started_at: time(r.get("started_at")),
                finished_at: time(r.get("finished_at")),
                waits_on: waits_on
                    .iter()
                    .map(|u| names.get(u).cloned().unwrap_or_else(|| format!("#{u}")))
                    .collect(),
                blocked_by: r.get("blocked_by"),
            });
        }
        Ok(Some(WorkflowStatus {
            id: workflow_id,
            counts,
            tasks,
        }))
    }

    /// Workflow `workflow_id`'s graph: counts per state, and its first
    /// `max_tasks` tasks with every job each waits or waited for (from
    /// `upstream_ids` and the edges still there; from the edges alone on a
    /// table without `upstream_ids`, see [`WorkflowGraph::from_edges_only`]).
    /// `None` if no job has this workflow id.
    pub async fn graph(&self, workflow_id: i64, max_tasks: usize) -> Result<Option<WorkflowGraph>> {
        WorkflowGraph::load(
            &self.pool,
            &self.table,
            self.enqueuer.records_upstreams(),
            workflow_id,
            max_tasks,
        )
        .await
    }
}
