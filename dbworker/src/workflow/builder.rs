//! `Workflow`: named tasks with `after` edges, checked to be a DAG before
//! anything is inserted.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::enqueue::{DependencyPolicy, GraphTask, NewJob};
use crate::error::{Error, Result};

/// One task of a [`Workflow`]: a name unique in the workflow, its job, and
/// the tasks it runs after.
///
/// ```
/// use dbworker::{NewJob, DependencyPolicy, workflow::Task};
/// let report = Task::new("report", NewJob::new())
///     .after(["fetch"])
///     .after_with(["optional_enrichment"], DependencyPolicy::IgnoreFailed);
/// ```
#[derive(Debug, Clone)]
pub struct Task {
    name: String,
    job: NewJob,
    after: Vec<(String, DependencyPolicy)>,
}

impl Task {
    /// A task named `name` running `job` (no key, no [`NewJob::after`]: the
    /// workflow's edges say what it waits for).
    pub fn new(name: impl Into<String>, job: NewJob) -> Task {
        Task {
            name: name.into(),
            job,
            after: Vec::new(),
        }
    }

    /// Runs after the tasks `names` complete; when one fails or is canceled,
    /// this task is canceled ([`DependencyPolicy::Cancel`]).
    pub fn after<S: Into<String>>(self, names: impl IntoIterator<Item = S>) -> Task {
        self.after_with(names, DependencyPolicy::Cancel)
    }

    /// Runs after the tasks `names` end, with `policy` for when one of them
    /// fails or is canceled.
    pub fn after_with<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
        policy: DependencyPolicy,
    ) -> Task {
        for name in names {
            let name = name.into();
            self.after.retain(|(n, _)| *n != name);
            self.after.push((name, policy));
        }
        self
    }
}

/// A graph of named tasks, enqueued all at once by
/// [`Workflows::enqueue`](super::Workflows::enqueue). The edges must form a
/// DAG: duplicate names, unknown names and cycles are refused before
/// anything is inserted.
///
/// ```
/// use dbworker::{NewJob, workflow::{Task, Workflow}};
/// // A diamond: b and c after a, d after both.
/// let workflow = Workflow::new()
///     .task(Task::new("a", NewJob::new()))
///     .task(Task::new("b", NewJob::new()).after(["a"]))
///     .task(Task::new("c", NewJob::new()).after(["a"]))
///     .task(Task::new("d", NewJob::new()).after(["b", "c"]));
/// assert!(workflow.check().is_ok());
/// let cycle = Workflow::new()
///     .task(Task::new("a", NewJob::new()).after(["b"]))
///     .task(Task::new("b", NewJob::new()).after(["a"]));
/// assert!(cycle.check().is_err());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Workflow {
    tasks: Vec<Task>,
}

impl Workflow {
    /// An empty workflow.
    pub fn new() -> Workflow {
        Workflow::default()
    }

    /// Adds a task.
    pub fn task(mut self, task: Task) -> Workflow {
        self.tasks.push(task);
        self
    }

    /// The number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the workflow has no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Checks the graph: at least one task, names non-empty and unique, every
    /// `after` name a task of this workflow, no cycle.
    pub fn check(&self) -> Result<()> {
        self.graph().map(|_| ())
    }

    /// The tasks in an order where each comes after those it waits for (so
    /// ids grow along every edge), with edges as indexes into that order.
    pub(crate) fn graph(&self) -> Result<Vec<GraphTask<'_>>> {
        let invalid = |reason: String| Error::InvalidOption {
            field: "workflow",
            reason,
        };
        if self.tasks.is_empty() {
            return Err(invalid("a workflow needs at least one task".into()));
        }
        let mut index = HashMap::with_capacity(self.tasks.len());
        for (i, task) in self.tasks.iter().enumerate() {
            if task.name.is_empty() {
                return Err(invalid(format!("task {i} has an empty name")));
            }
            if task.name.contains('\0') {
                return Err(invalid(format!(
                    "task name {:?} holds a NUL character (U+0000), which PostgreSQL cannot store",
                    task.name
                )));
            }
            if index.insert(task.name.as_str(), i).is_some() {
                return Err(invalid(format!("two tasks are named {:?}", task.name)));
            }
        }
        // Kahn's algorithm: what is never freed lies on or behind a cycle.
        let mut waiting = vec![0usize; self.tasks.len()];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for (i, task) in self.tasks.iter().enumerate() {
            for (name, _) in &task.after {
                let Some(&u) = index.get(name.as_str()) else {
                    return Err(invalid(format!(
                        "task {:?} runs after {name:?}, which is not a task of this workflow",
                        task.name
                    )));
                };
                waiting[i] += 1;
                dependents[u].push(i);
            }
        }
        let mut ready: VecDeque<usize> =
            (0..self.tasks.len()).filter(|&i| waiting[i] == 0).collect();
        let mut order = Vec::with_capacity(self.tasks.len());
        while let Some(i) = ready.pop_front() {
            order.push(i);
            for &d in &dependents[i] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    ready.push_back(d);
                }
            }
        }
        if order.len() < self.tasks.len() {
            let stuck: Vec<&str> = (0..self.tasks.len())
                .filter(|&i| waiting[i] > 0)
                .map(|i| self.tasks[i].name.as_str())
                .collect();
            return Err(invalid(format!(
                "the tasks' edges form a cycle (through {})",
                stuck.join(", ")
            )));
        }
        let position: HashMap<usize, usize> =
            order.iter().enumerate().map(|(p, &i)| (i, p)).collect();
        Ok(order
            .iter()
            .map(|&i| {
                let task = &self.tasks[i];
                GraphTask {
                    name: &task.name,
                    job: &task.job,
                    after: task
                        .after
                        .iter()
                        .map(|(name, policy)| (position[&index[name.as_str()]], policy.as_str()))
                        .collect(),
                }
            })
            .collect())
    }
}

/// What [`Workflows::enqueue`](super::Workflows::enqueue) inserted: the
/// workflow's id and each task's job id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueuedWorkflow {
    /// The workflow's id (the `workflow_id` column of its jobs).
    pub id: i64,
    /// Each task's job id, by task name.
    pub ids: BTreeMap<String, i64>,
}

impl EnqueuedWorkflow {
    /// The job id of the task `name`.
    pub fn id_of(&self, name: &str) -> Option<i64> {
        self.ids.get(name).copied()
    }
}
