//! The list of a table's workflows, newest first, each with its tasks counted
//! per state: keyset pages down the `workflow_id` index, never a scan of the
//! job table (see `sql::workflow_list`).

use std::collections::BTreeMap;

use sqlx::Row;

use super::Workflows;
use crate::error::{Error, Result};
use crate::sql;

/// A workflow's state, from its tasks' states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkflowState {
    /// A task is not final yet (pending, queued, errored or processing).
    Running,
    /// Every task is final, and one failed.
    Failed,
    /// Every task is final, none failed, and one was canceled.
    Canceled,
    /// Every task completed.
    Completed,
}

impl WorkflowState {
    /// The state's name, as the list filter takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Failed => "failed",
            WorkflowState::Canceled => "canceled",
            WorkflowState::Completed => "completed",
        }
    }
}

impl std::str::FromStr for WorkflowState {
    type Err = Error;

    fn from_str(s: &str) -> Result<WorkflowState> {
        Ok(match s {
            "running" => WorkflowState::Running,
            "failed" => WorkflowState::Failed,
            "canceled" => WorkflowState::Canceled,
            "completed" => WorkflowState::Completed,
            other => {
                return Err(Error::InvalidOption {
                    field: "state",
                    reason: format!(
                        "unknown workflow state {} (one of running, finished, completed, failed, canceled)",
                        crate::job_filter::excerpt(other)
                    ),
                });
            }
        })
    }
}

/// Which workflows a [`WorkflowListRequest`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WorkflowFilter {
    /// Every workflow.
    #[default]
    Any,
    /// Workflows in this state.
    State(WorkflowState),
    /// Workflows whose every task is final (completed, failed or canceled).
    Finished,
}

impl std::str::FromStr for WorkflowFilter {
    type Err = Error;

    /// `""` (any), `finished`, or a [`WorkflowState`]'s name.
    fn from_str(s: &str) -> Result<WorkflowFilter> {
        Ok(match s {
            "" => WorkflowFilter::Any,
            "finished" => WorkflowFilter::Finished,
            state => WorkflowFilter::State(state.parse()?),
        })
    }
}

impl WorkflowFilter {
    fn as_str(self) -> &'static str {
        match self {
            WorkflowFilter::Any => "",
            WorkflowFilter::Finished => "finished",
            WorkflowFilter::State(s) => s.as_str(),
        }
    }
}

/// A page of [`Workflows::list`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkflowListRequest {
    /// Only workflows with an id below this (the previous page's
    /// [`WorkflowList::next`]); `None` starts with the newest.
    pub before: Option<i64>,
    /// At most this many workflows.
    pub limit: u32,
    /// Which to keep.
    pub filter: WorkflowFilter,
    /// With a filter, at most this many workflows are looked at for one page
    /// (each costs an index descent and its tasks' rows), so a rare state
    /// on a big table answers in bounded time; the page then says where to
    /// go on from. Default 1,000.
    pub look_at_most: u32,
}

impl WorkflowListRequest {
    /// The newest `limit` workflows kept by `filter`.
    pub fn first(limit: u32, filter: WorkflowFilter) -> WorkflowListRequest {
        WorkflowListRequest {
            before: None,
            limit,
            filter,
            look_at_most: 1000,
        }
    }
}

/// One workflow of a [`WorkflowList`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkflowSummary {
    /// The workflow's id.
    pub id: i64,
    /// Its state.
    pub state: WorkflowState,
    /// Its tasks per job state.
    pub counts: BTreeMap<String, u64>,
    /// Its task count.
    pub total: u64,
    /// Seconds since its first task was queued (database clock).
    pub age_seconds: f64,
}

/// A page of workflows, newest first.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkflowList {
    /// The workflows kept, newest first.
    pub workflows: Vec<WorkflowSummary>,
    /// Where the next page starts ([`WorkflowListRequest::before`]), if
    /// there may be more.
    pub next: Option<i64>,
    /// How many workflows were looked at for this page.
    pub looked_at: u64,
    /// The page stopped at [`WorkflowListRequest::look_at_most`] before it
    /// was full: older workflows were not looked at yet.
    pub cut_short: bool,
}

impl Workflows {
    /// A page of the table's workflows, newest first, each with its tasks
    /// counted per state and its age. Walks the `workflow_id` index: a page
    /// costs its workflows' tasks, never a scan of the table.
    pub async fn list(&self, request: WorkflowListRequest) -> Result<WorkflowList> {
        if request.limit == 0 {
            return Err(Error::InvalidOption {
                field: "limit",
                reason: "must be at least 1".into(),
            });
        }
        let page = u64::from(request.limit) + 1;
        let budget = match request.filter {
            WorkflowFilter::Any => page,
            _ => u64::from(request.look_at_most.max(request.limit)) + 1,
        };
        let rows = sql::workflow_list(
            &self.table,
            request.before.unwrap_or(i64::MAX),
            budget,
            request.filter.as_str(),
            page,
        )
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db("workflow_list"))?;
        let (scanned, last) = rows
            .first()
            .map(|r| (r.get::<i64, _>("scanned"), r.get::<Option<i64>, _>("last")))
            .unwrap_or((0, None));
        let mut workflows = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(id) = r.get::<Option<i64>, _>("id") else {
                continue;
            };
            let counts: serde_json::Value = r.get("counts");
            let counts = counts
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default();
            let state: String = r.get("state");
            workflows.push(WorkflowSummary {
                id,
                state: state.parse()?,
                counts,
                total: u64::try_from(r.get::<i64, _>("total")).unwrap_or(0),
                age_seconds: r.get("age"),
            });
        }
        let full = workflows.len() > request.limit as usize;
        workflows.truncate(request.limit as usize);
        let scanned = u64::try_from(scanned).unwrap_or(0);
        let cut_short = !full && scanned == budget;
        let next = if full {
            workflows.last().map(|w| w.id)
        } else if cut_short {
            last
        } else {
            None
        };
        Ok(WorkflowList {
            workflows,
            next,
            looked_at: scanned,
            cut_short,
        })
    }
}
