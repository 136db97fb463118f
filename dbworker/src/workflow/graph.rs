//! A workflow's graph as it stands: its tasks with their states and every
//! upstream job each one waits or waited for, for the dashboard's drawing
//! and `dbworker workflow show`.

use std::collections::BTreeMap;

use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::sql::{self, Table};

/// One task of a [`WorkflowGraph`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphTask {
    /// The task's job id.
    pub id: i64,
    /// The task's name (`None` for a job put in the workflow by hand).
    pub name: Option<String>,
    /// The job's state.
    pub state: String,
    /// The jobs it waits or waited for, in id order: with `upstream_ids`,
    /// every one; without it, only those whose edge is still there.
    pub upstream: Vec<i64>,
}

impl GraphTask {
    /// Its name, or `#id` without one.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| format!("#{}", self.id))
    }
}

/// A workflow's graph, from [`Workflows::graph`](super::Workflows::graph).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkflowGraph {
    /// The workflow's id.
    pub id: i64,
    /// Tasks per state, every task counted.
    pub counts: BTreeMap<String, u64>,
    /// The tasks in id order: all of them, or the first `max_tasks` when
    /// `truncated`.
    pub tasks: Vec<GraphTask>,
    /// More tasks than `max_tasks`: `tasks` holds the first of them.
    pub truncated: bool,
    /// The table has no `upstream_ids` column (migrated with `--workflows`
    /// before it had one): the edges already satisfied are gone, so the
    /// graph shows only what is still waited for.
    pub from_edges_only: bool,
}

impl WorkflowGraph {
    /// How many tasks the workflow has.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Every edge `(upstream, dependent)` whose upstream is one of `tasks`,
    /// in dependent then upstream order.
    pub fn edges(&self) -> Vec<(i64, i64)> {
        let ids: std::collections::HashSet<i64> = self.tasks.iter().map(|t| t.id).collect();
        self.tasks
            .iter()
            .flat_map(|t| t.upstream.iter().map(move |&u| (u, t.id)))
            .filter(|(u, _)| ids.contains(u))
            .collect()
    }

    /// Upstream jobs outside the workflow (a task added with `NewJob::after`
    /// waits for them, or the list was truncated), with the task waiting.
    pub fn outside_edges(&self) -> Vec<(i64, i64)> {
        let ids: std::collections::HashSet<i64> = self.tasks.iter().map(|t| t.id).collect();
        self.tasks
            .iter()
            .flat_map(|t| t.upstream.iter().map(move |&u| (u, t.id)))
            .filter(|(u, _)| !ids.contains(u))
            .collect()
    }

    /// Loads workflow `id`'s counts and its first `max_tasks` tasks; `None`
    /// if no job has this workflow id.
    pub(crate) async fn load(
        pool: &PgPool,
        table: &Table,
        recorded: bool,
        id: i64,
        max_tasks: usize,
    ) -> Result<Option<WorkflowGraph>> {
        let counts: BTreeMap<String, u64> = sql::workflow_counts(table, id)
            .fetch_all(pool)
            .await
            .map_err(Error::db("workflow_graph"))?
            .iter()
            .map(|r| {
                let n: i64 = r.get("count");
                (r.get("state"), u64::try_from(n).unwrap_or(0))
            })
            .collect();
        if counts.is_empty() {
            return Ok(None);
        }
        // Bound as a bigint: `usize::MAX` (everything) must fit.
        let limit = u64::try_from(max_tasks)
            .unwrap_or(u64::MAX)
            .min(i64::MAX as u64);
        let tasks: Vec<GraphTask> = sql::workflow_graph(table, id, recorded, limit)
            .fetch_all(pool)
            .await
            .map_err(Error::db("workflow_graph"))?
            .iter()
            .map(|r| GraphTask {
                id: r.get("id"),
                name: r.get("task_name"),
                state: r.get("state"),
                upstream: r.get("upstream"),
            })
            .collect();
        let total: u64 = counts.values().sum();
        Ok(Some(WorkflowGraph {
            id,
            truncated: (tasks.len() as u64) < total,
            counts,
            tasks,
            from_edges_only: !recorded,
        }))
    }
}
