//! `dbworker workflow show|cancel ID`: a workflow's tasks, their states,
//! what each waits for and the graph's edges; canceling the whole workflow.

use std::time::SystemTime;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dbworker::workflow::Workflows;

use crate::args::{Format, FormatArg, Target};
use crate::commands::json::{self, print_json};
use crate::exit::{not_found, refused};

#[derive(Debug, Args)]
pub(crate) struct WorkflowArgs {
    #[command(subcommand)]
    command: WorkflowCommand,
}

#[derive(Debug, Subcommand)]
enum WorkflowCommand {
    /// Each task of a workflow: its job id, state, times, what it waits for; then its edges.
    Show(WorkflowShowArgs),
    /// Cancel a workflow: waiting tasks now, running ones through their workers.
    Cancel(WorkflowCancelArgs),
}

#[derive(Debug, Args)]
struct WorkflowCancelArgs {
    #[command(flatten)]
    workflow: WorkflowIdArgs,
    /// Cancel without asking (needed when stdin is not a terminal).
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
struct WorkflowShowArgs {
    #[command(flatten)]
    workflow: WorkflowIdArgs,
    #[command(flatten)]
    format: FormatArg,
}

#[derive(Debug, Args)]
struct WorkflowIdArgs {
    #[command(flatten)]
    target: Target,
    /// The workflow's id (the `workflow_id` column of its jobs).
    id: i64,
}

pub(crate) async fn workflow(args: WorkflowArgs) -> Result<()> {
    match args.command {
        WorkflowCommand::Show(args) => show(args).await,
        WorkflowCommand::Cancel(args) => cancel(args).await,
    }
}

async fn workflows(target: &Target) -> Result<Workflows> {
    let pool = target.connect().await?;
    let table = target
        .job_table_with(&pool, |o| o.workflows = true)
        .await
        .context("the job table's workflows (`dbworker migration --workflows` adds them)")?;
    Workflows::new(&pool, &table)
        .await
        .context("the job table has no workflows (`dbworker migration --workflows`)")
}

async fn show(show: WorkflowShowArgs) -> Result<()> {
    let args = show.workflow;
    let workflows = workflows(&args.target).await?;
    let Some(status) = workflows
        .status(args.id)
        .await
        .with_context(|| format!("reading workflow {}", args.id))?
    else {
        return Err(not_found(format!("no workflow {}", args.id)));
    };
    if show.format.format == Format::Json {
        let edges: Vec<(i64, i64)> = workflows
            .graph(args.id, usize::MAX)
            .await
            .with_context(|| format!("reading workflow {}", args.id))?
            .map(|g| g.edges().into_iter().chain(g.outside_edges()).collect())
            .unwrap_or_default();
        return print_json(&json::workflow(&status, &edges));
    }
    let counts: Vec<String> = status
        .counts
        .iter()
        .map(|(state, n)| format!("{n} {state}"))
        .collect();
    println!("workflow {}: {}", status.id, counts.join(", "));
    println!(
        "{:>10}  {:<20} {:<11} {:>9}  waits on",
        "job", "task", "state", "ran (s)"
    );
    for t in &status.tasks {
        let ran = match (t.started_at, t.finished_at) {
            (Some(s), Some(f)) => f
                .duration_since(s)
                .map(|d| format!("{:.3}", d.as_secs_f64()))
                .unwrap_or_default(),
            (Some(s), None) => SystemTime::now()
                .duration_since(s)
                .map(|d| format!("{:.0}+", d.as_secs_f64()))
                .unwrap_or_default(),
            _ => String::new(),
        };
        let mut waits = super::text::printable(&t.waits_on.join(", "));
        if let Some(culprit) = t.blocked_by {
            waits = format!("canceled: upstream job {culprit} did not complete");
        }
        println!(
            "{:>10}  {:<20} {:<11} {:>9}  {}",
            t.id,
            super::text::printable(&t.name),
            t.state,
            ran,
            waits
        );
    }
    // The whole graph, the edges already satisfied included (from
    // `upstream_ids`), as `upstream → dependent`.
    let Some(graph) = workflows
        .graph(args.id, usize::MAX)
        .await
        .with_context(|| format!("reading workflow {}", args.id))?
    else {
        return Ok(());
    };
    let names: std::collections::HashMap<i64, String> = graph
        .tasks
        .iter()
        .map(|t| (t.id, super::text::printable(&t.label())))
        .collect();
    let name = |id: i64| names.get(&id).cloned().unwrap_or_else(|| format!("#{id}"));
    if graph.from_edges_only {
        println!(
            "edges not yet satisfied (the table has no upstream_ids column: run `dbworker migration --workflows` again to keep them all):"
        );
    } else {
        println!("edges:");
    }
    for (from, to) in graph.edges().into_iter().chain(graph.outside_edges()) {
        println!("  {} → {}", name(from), name(to));
    }
    Ok(())
}

async fn cancel(args: WorkflowCancelArgs) -> Result<()> {
    let WorkflowCancelArgs {
        workflow: args,
        yes,
    } = args;
    let workflows = workflows(&args.target).await?;
    // No such workflow is said before asking anything.
    if workflows
        .status(args.id)
        .await
        .with_context(|| format!("reading workflow {}", args.id))?
        .is_none()
    {
        return Err(not_found(format!("no workflow {}", args.id)));
    }
    // Asked as `dbworker cancel --workflow` asks: refused when no one can
    // answer and --yes is not given.
    let question = format!(
        "cancel every unfinished task of workflow {}? [y/N] ",
        args.id
    );
    if !yes && !crate::commands::jobs::confirm(&question)? {
        return Err(refused(format!(
            "workflow {}: nothing done (pass --yes to cancel it)",
            args.id
        )));
    }
    let done = workflows
        .cancel(args.id)
        .await
        .with_context(|| format!("canceling workflow {}", args.id))?;
    if done.canceled + done.requested == 0 {
        // Nothing matched: no such workflow, or every task has finished.
        let status = workflows
            .status(args.id)
            .await
            .with_context(|| format!("reading workflow {}", args.id))?;
        match status {
            None => return Err(not_found(format!("no workflow {}", args.id))),
            Some(_) => {
                return Err(refused(format!(
                    "workflow {} has no waiting or running task to cancel",
                    args.id
                )));
            }
        }
    }
    println!(
        "workflow {}: {} waiting tasks canceled, {} running tasks asked to cancel",
        args.id, done.canceled, done.requested
    );
    Ok(())
}
