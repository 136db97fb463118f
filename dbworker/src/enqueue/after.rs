//! Jobs that wait for other jobs: a dependent added to existing jobs
//! ([`NewJob::after`]), and a whole graph of new jobs inserted at once (what
//! `Workflows` enqueues). Both insert the job rows and their edges in one
//! transaction; the release trigger (`ddl::workflows_sql`) does the rest.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sqlx::{Connection, PgConnection, Row};

use super::{Enqueued, Enqueuer, NewJob};
use crate::columns::{HAS_DEPENDENTS, TASK_NAME, WORKFLOW_ID};
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql::{self, JobRow, Table};

/// One task of a graph to insert: its job, its name, and the tasks (by index
/// into the graph) it waits for, each with the edge's stored policy (a
/// [`DependencyPolicy`](super::DependencyPolicy)'s name, or `on_failure` for a batch's failure
/// callback).
#[derive(Debug)]
pub(crate) struct GraphTask<'a> {
    pub(crate) name: &'a str,
    pub(crate) job: &'a NewJob,
    pub(crate) after: Vec<(usize, &'static str)>,
}

impl Enqueuer {
    fn workflow_table(&self) -> Result<&Table> {
        if !self.target.workflows {
            return Err(Error::InvalidOption {
                field: "workflows",
                reason: "the job waits for other jobs, but the table has no workflows (JobTableOptions::workflows)".into(),
            });
        }
        Ok(&self.target)
    }

    /// The grants a job that waits needs beyond an enqueue: `UPDATE` on the
    /// table (the upstream jobs are locked and marked), `INSERT` of its edges
    /// and what the release trigger does. Checked once, at the first such
    /// enqueue, so a missing one is named instead of a bare `permission
    /// denied`; on the caller's connection, since waiting for another from
    /// the pool could wait for this one.
    async fn check_after_grants(&self, conn: &mut PgConnection, w: &Table) -> Result<()> {
        if self.after_checked.load(Ordering::Relaxed) {
            return Ok(());
        }
        Grants::new("enqueueing a job that waits for others (NewJob::after)")
            .on_table(w, &[Privilege::Update])
            .on_deps(w, &[Privilege::Insert])
            .release_trigger(w)
            .check(conn)
            .await?;
        self.after_checked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Sets `upstream_ids` on the new dependents (the table has the column).
    async fn record_upstreams(
        &self,
        conn: &mut PgConnection,
        dependents: Vec<i64>,
        upstream: Vec<i64>,
    ) -> Result<()> {
        let w = self.workflow_table()?;
        sql::record_upstreams(w, dependents, upstream)
            .execute(conn)
            .await
            .map_err(Error::db("record_upstreams"))?;
        Ok(())
    }

    /// Inserts `job`, waiting for its `after` jobs. Those are locked `FOR
    /// SHARE` first, so none finishes until this commits: each either
    /// finished before (a completed one counts at once, a failed or canceled
    /// one applies the policy at once), or finishes after and finds the edge.
    pub(super) async fn enqueue_after(
        &self,
        conn: &mut PgConnection,
        job: &NewJob,
    ) -> Result<Enqueued> {
        let w = self.workflow_table()?;
        if job.key_value().is_some() {
            return Err(Error::InvalidOption {
                field: "key",
                reason: "a job that waits for other jobs cannot have a key".into(),
            });
        }
        self.check_after_grants(conn, w).await?;
        let after = job.after_value();
        let mut tx = conn.begin().await.map_err(Error::db("begin"))?;
        let ids: Vec<i64> = after.iter().map(|(id, _)| *id).collect();
        let states: HashMap<i64, String> = sql::lock_upstreams(w, ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("lock_upstreams"))?
            .iter()
            .map(|r| (r.get("id"), r.get("state")))
            .collect();
        let mut edges = Vec::new();
        let mut blocker = None;
        for &(id, policy) in after {
            let Some(state) = states.get(&id) else {
                return Err(Error::InvalidOption {
                    field: "after",
                    reason: format!("job {id} does not exist"),
                });
            };
            match state.as_str() {
                "completed" => {}
                s @ ("failed" | "canceled") if policy.ignores(s) => {}
                s @ ("failed" | "canceled") => {
                    // The edge stays, so a retry of `id` brings this job back.
                    blocker.get_or_insert((id, s.to_owned()));
                    edges.push((id, policy));
                }
                _ => edges.push((id, policy)),
            }
        }
        let mut row = job.clone();
        if !edges.is_empty() {
            row = row.set(w.columns.state.clone(), "pending");
        }
        let id: i64 = sql::enqueue_rows(&self.target, &[row.row()])
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("enqueue"))?
            .get("id");
        if !edges.is_empty() {
            sql::mark_has_dependents(w, edges.iter().map(|(u, _)| *u).collect())
                .execute(&mut *tx)
                .await
                .map_err(Error::db("mark_has_dependents"))?;
            sql::deps_insert(
                w,
                vec![id; edges.len()],
                edges.iter().map(|(u, _)| *u).collect(),
                edges.iter().map(|(_, p)| p.as_str().to_owned()).collect(),
            )
            .execute(&mut *tx)
            .await
            .map_err(Error::db("deps_insert"))?;
        }
        if self.target.upstream_ids {
            // Every upstream, completed ones included: the handler reads them all.
            let upstream: Vec<i64> = after.iter().map(|(u, _)| *u).collect();
            self.record_upstreams(&mut tx, vec![id; upstream.len()], upstream)
                .await?;
        }
        if let Some((upstream, state)) = blocker {
            let message = format!("upstream job {upstream} was {state}");
            sql::cancel_blocked(w, id, upstream, &message)
                .execute(&mut *tx)
                .await
                .map_err(Error::db("cancel_blocked"))?;
        }
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok(Enqueued::Inserted(id))
    }

    /// Inserts a graph of new jobs as one workflow, all or none: the jobs in
    /// one statement (`pending` where a task waits, `queued` otherwise), then
    /// their edges. Returns the workflow id and the tasks' ids in order. The
    /// caller has checked the graph (names, no cycle).
    pub(crate) async fn insert_graph(
        &self,
        conn: &mut PgConnection,
        tasks: &[GraphTask<'_>],
    ) -> Result<(i64, Vec<i64>)> {
        let w = self.workflow_table()?;
        for task in tasks {
            self.check_job(task.job)?;
            if task.job.key_value().is_some() || !task.job.after_value().is_empty() {
                return Err(Error::InvalidOption {
                    field: "task",
                    reason: format!(
                        "task {:?}: a workflow's job has no key and waits through the workflow's edges, not NewJob::after",
                        task.name
                    ),
                });
            }
        }
        let mut tx = conn.begin().await.map_err(Error::db("begin"))?;
        let workflow_id: i64 = sql::workflow_next_id(w)
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("workflow_next_id"))?
            .get("id");
        let mut waited_for = vec![false; tasks.len()];
        for t in tasks {
            for &(u, _) in &t.after {
                waited_for[u] = true;
            }
        }
        let jobs: Vec<NewJob> = tasks
            .iter()
            .zip(&waited_for)
            .map(|(t, &waited_for)| {
                let state = if t.after.is_empty() {
                    "queued"
                } else {
                    "pending"
                };
                t.job
                    .clone()
                    .set(w.columns.state.clone(), state)
                    .set(WORKFLOW_ID, workflow_id)
                    .set(TASK_NAME, t.name)
                    .set(HAS_DEPENDENTS, waited_for)
            })
            .collect();
        // The current span's context, for the tasks that name none.
        let ambient = self.ambient_context();
        let rows: Vec<JobRow<'_>> = jobs
            .iter()
            .map(|j| j.row_traced(ambient.as_ref()))
            .collect();
        let mut ids = Vec::with_capacity(tasks.len());
        let per_row = super::binds_per_row(&jobs);
        for chunk in rows.chunks((super::MAX_BIND_PARAMETERS / per_row).max(1)) {
            let inserted = sql::enqueue_rows(&self.target, chunk)
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db("enqueue_workflow"))?;
            ids.extend(inserted.iter().map(|r| r.get::<i64, _>("id")));
        }
        let (mut dependents, mut upstream, mut policies) = (Vec::new(), Vec::new(), Vec::new());
        for (i, task) in tasks.iter().enumerate() {
            for &(u, policy) in &task.after {
                dependents.push(ids[i]);
                upstream.push(ids[u]);
                policies.push(policy.to_owned());
            }
        }
        if !dependents.is_empty() {
            if self.target.upstream_ids {
                self.record_upstreams(&mut tx, dependents.clone(), upstream.clone())
                    .await?;
            }
            sql::deps_insert(w, dependents, upstream, policies)
                .execute(&mut *tx)
                .await
                .map_err(Error::db("deps_insert"))?;
        }
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok((workflow_id, ids))
    }
}
