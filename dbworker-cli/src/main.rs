//! `dbworker`: operate a job table — run the resetter or the purger as their
//! own processes, print DDL, look at jobs (`status`, `list`, `show`, `top`)
//! and act on them (`requeue`, `cancel`, `fail`, `delete`, `complete`,
//! `reschedule`, `remove`, `pause`, `resume`, `limit`).

mod args;
mod commands;
mod exit;
mod signal;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use commands::{
    completions, control, cron, fair, history, jobs, limits, maintenance, migration, partitions,
    send_signal, status, top, ui, workflow,
};

#[derive(Debug, Parser)]
#[command(
    name = "dbworker",
    version,
    about = "Operate dbworker job tables",
    after_help = exit::HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Requeue (or fail) stalled processing jobs, every interval, until stopped.
    Reset(maintenance::ResetArgs),
    /// Print the CREATE TABLE and indexes for a new job table.
    Migration(migration::MigrationArgs),
    /// Delete (or archive) finished jobs older than their state's age.
    Purge(maintenance::PurgeArgs),
    /// Enqueue the jobs of a crontab file's schedules (`./crontab`), each
    /// tick once however many run, every interval until stopped.
    Cron(cron::CronArgs),
    /// Record the job history (finished jobs per queue and minute) the
    /// dashboard's charts and `top` read, every interval until stopped.
    History(history::HistoryArgs),
    /// Partitioned job tables: `create --ahead N` makes the upcoming partitions.
    Partitions(partitions::PartitionsArgs),
    /// Every state per queue and in total, paused queues, the oldest wait,
    /// who is processing, and (with the registry) the live processes and the
    /// leader.
    Status(status::StatusArgs),
    /// Jobs matching a filter, a page at a time (by id).
    List(jobs::ListArgs),
    /// One job's row, every column, as pretty JSON.
    Show(jobs::JobArgs),
    /// Put failed, canceled or errored jobs back in the queue (one, or every
    /// job matching the filter).
    Requeue(jobs::ActionArgs),
    /// Cancel jobs: waiting ones now, processing ones through their worker.
    Cancel(jobs::ActionArgs),
    /// Fail waiting jobs.
    Fail(jobs::ActionArgs),
    /// Delete jobs that no worker holds.
    Delete(jobs::ActionArgs),
    /// Mark queued, errored, failed or canceled jobs completed (never a
    /// processing one).
    Complete(jobs::ActionArgs),
    /// Put queued, errored, failed or canceled jobs back in the queue with a
    /// new run-at, priority, failure count or retry limit (each optional).
    Reschedule(jobs::RescheduleArgs),
    /// Delete the queued or errored job holding a key (a processing one is
    /// left alone).
    Remove(jobs::RemoveArgs),
    /// A live view of queues, their history and the hosts working (q quits).
    Top(top::TopArgs),
    /// Serve the web dashboard.
    Ui(ui::UiArgs),
    /// Pause the table, or one queue, for every worker that honours pauses.
    Pause(control::PauseArgs),
    /// Resume the table, or one queue, and wake listening workers.
    Resume(control::PauseArgs),
    /// A queue's global limits (`migration --limits`), enforced by every
    /// worker's claim: `set --queue Q [--max-processing N] [--rate R
    /// [--burst B]]`, `clear --queue Q`, `list`.
    Limit(limits::LimitArgs),
    /// A fair table's keys (`migration --fair`): what each has waiting and
    /// running, its weight; `--set key=weight`, `--remove key`.
    Fair(fair::FairArgs),
    /// Send a job the signal it waits for (`migration --signals`): `--id N`
    /// or `--key K`, `--name`, `--payload JSON`, `--dedupe KEY`.
    Signal(send_signal::SignalArgs),
    /// Workflows (`migration --workflows`): `show ID`, `cancel ID`.
    Workflow(workflow::WorkflowArgs),
    /// Print the shell completion script: `dbworker completions bash >
    /// /etc/bash_completion.d/dbworker` (also zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Migration(args) => migration::migration(args),
        Command::Purge(args) => maintenance::purge(args).await,
        Command::History(args) => history::history(args).await,
        Command::Cron(args) => cron::cron(args).await,
        Command::Partitions(args) => partitions::partitions(args).await,
        Command::Status(args) => status::status(args).await,
        Command::List(args) => jobs::list(args).await,
        Command::Show(args) => jobs::show(args).await,
        Command::Requeue(args) => jobs::act("requeue", args).await,
        Command::Cancel(args) => jobs::act("cancel", args).await,
        Command::Delete(args) => jobs::act("delete", args).await,
        Command::Fail(args) => jobs::act("fail", args).await,
        Command::Complete(args) => jobs::act("complete", args).await,
        Command::Reschedule(args) => jobs::reschedule(args).await,
        Command::Remove(args) => jobs::remove(args).await,
        Command::Top(args) => top::top(args).await,
        Command::Ui(args) => ui::serve(args).await,
        Command::Pause(args) => control::pause(args, false).await,
        Command::Resume(args) => control::pause(args, true).await,
        Command::Limit(args) => limits::limit(args).await,
        Command::Fair(args) => fair::fair(args).await,
        Command::Signal(args) => send_signal::signal(args).await,
        Command::Reset(args) => maintenance::reset(args).await,
        Command::Workflow(args) => workflow::workflow(args).await,
        Command::Completions(args) => {
            completions::completions(args, Cli::command());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("dbworker: {}", report(&error));
            ExitCode::from(exit::status(&error))
        }
    }
}

/// The error on one line: its context, then each cause the messages before
/// it do not already include (many errors print their source themselves).
/// A cause may quote a name or the database's own text, so each is printed
/// with its control characters as spaces; only the library's lists of
/// problems (`Error::Schema`, `Error::Access`: a line `\n  - ` each) keep
/// their lines.
fn report(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause
            .to_string()
            .split(PROBLEM)
            .map(commands::text::printable)
            .collect::<Vec<_>>()
            .join(PROBLEM);
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// How the library's multi-line errors start each problem.
const PROBLEM: &str = "\n  - ";

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::report;

    #[derive(Debug, thiserror::Error)]
    #[error("database error in status: {source}")]
    struct Db {
        source: std::io::Error,
    }

    #[test]
    fn a_report_gives_each_context_and_cause_once() {
        let io = std::io::Error::other("connection refused");
        let err = Err::<(), _>(Db { source: io })
            .context("status of jobs")
            .unwrap_err();
        assert_eq!(
            report(&err),
            "status of jobs: database error in status: connection refused"
        );
        assert_eq!(report(&anyhow::anyhow!("no job 7")), "no job 7");
        let quoted = anyhow::anyhow!("no live job holds key k\x1b[2J\nforged in jobs");
        assert_eq!(
            report(&quoted),
            "no live job holds key k [2J forged in jobs"
        );
        let listed =
            anyhow::anyhow!("the job table does not match:\n  - no column a\x1b\n  - no b");
        assert_eq!(
            report(&listed),
            "the job table does not match:\n  - no column a \n  - no b"
        );
    }
}
