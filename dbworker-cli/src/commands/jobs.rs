//! `dbworker list`, `dbworker show`, the actions on one job or on every job
//! matching a filter (`requeue`, `cancel`, `fail`, `delete`, `complete`,
//! `reschedule`): a count, a confirmation, batches with a progress bar; and
//! `dbworker remove --key`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Args;
use dbworker::JobTableOptions;
use dbworker::admin::{
    Admin, BulkAction, Canceled, FieldFilter, JobFilter, JobSort, PageRequest, Removed, Reschedule,
    format_age,
};
use indicatif::{ProgressBar, ProgressStyle};
use workerutil::JobState;

use crate::args::{Format, FormatArg, ReadArgs, TableArgs, duration};
use crate::commands::json::{self, print_json};
use crate::exit::{not_found, refused, usage};

/// Which jobs: every flag given must match.
#[derive(Debug, Args, Default)]
pub(crate) struct FilterArgs {
    /// Only jobs in these states (repeatable or comma-separated), or
    /// `stalled`: processing jobs whose heartbeat is older than
    /// --stalled-after, as `status` counts them.
    #[arg(long = "state", value_delimiter = ',', value_parser = parse_state)]
    states: Vec<StateArg>,
    /// With `--state stalled`: a processing job whose heartbeat is older
    /// than this counts as stalled (`status`'s --stalled-after).
    #[arg(long, default_value = "30s", value_parser = crate::args::duration)]
    stalled_after: Duration,
    /// Only jobs of this queue (the table's `queue` column, or --queue-column).
    #[arg(long)]
    queue: Option<String>,
    /// Only jobs of this kind (the table's `kind` column, or --kind-column).
    #[arg(long)]
    kind: Option<String>,
    /// Only jobs queued at least this long ago (`30m`, `2h`, `1d`).
    #[arg(long, value_parser = duration, alias = "older-than-secs")]
    older_than: Option<Duration>,
    /// Only jobs queued at most this long ago.
    #[arg(long, value_parser = duration, alias = "newer-than-secs")]
    newer_than: Option<Duration>,
    /// Only jobs whose failure message contains this text (any case).
    #[arg(long)]
    failure: Option<String>,
    /// Only jobs whose column equals a value, `column=value`, or a field of a
    /// JSON column, `payload.customer_id=42` (repeatable).
    #[arg(long = "field", value_parser = parse_field)]
    fields: Vec<FieldFilter>,
    /// Only the tasks of this workflow (a table migrated with --workflows).
    #[arg(long)]
    workflow: Option<i64>,
}

impl FilterArgs {
    /// The filter, checked against `admin`'s table: a queue or kind needs
    /// its column, and the error names the flag that gives it.
    pub(crate) fn filter(&self, admin: &Admin) -> Result<JobFilter> {
        for (wanted, column, flag) in [
            (&self.queue, admin.queue_column(), "queue"),
            (&self.kind, admin.kind_column(), "kind"),
        ] {
            if wanted.is_some() && column.is_none() {
                return Err(usage(format!(
                    "--{flag} needs the table's {flag} column: the table has no column named {flag}, so name yours with --{flag}-column"
                )));
            }
        }
        let mut f = JobFilter::default();
        let stalled = self.states.contains(&StateArg::Stalled);
        if stalled && self.states.len() > 1 {
            return Err(usage(
                "--state stalled is a kind of processing job: it cannot be combined with other states",
            ));
        }
        f.states = self
            .states
            .iter()
            .filter_map(|s| match s {
                StateArg::State(s) => Some(*s),
                StateArg::Stalled => None,
            })
            .collect();
        f.stalled_after = stalled.then_some(self.stalled_after);
        f.queue = self.queue.clone();
        f.kind = self.kind.clone();
        f.older_than = self.older_than;
        f.newer_than = self.newer_than;
        f.failure_contains = self.failure.clone();
        f.fields = self.fields.clone();
        f.workflow_id = self.workflow;
        Ok(f)
    }

    /// What the table's description needs for this filter.
    fn describe(&self, o: &mut JobTableOptions) {
        o.workflows = self.workflow.is_some();
    }
}

/// A `--state` value: a job state, or `stalled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateArg {
    State(JobState),
    Stalled,
}

fn parse_state(s: &str) -> std::result::Result<StateArg, String> {
    if s == "stalled" {
        return Ok(StateArg::Stalled);
    }
    s.parse::<JobState>().map(StateArg::State).map_err(|_| {
        let valid: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!(
            "{s:?} is not a job state; the states are {}, and stalled",
            valid.join(", ")
        )
    })
}

fn parse_field(s: &str) -> std::result::Result<FieldFilter, String> {
    s.parse().map_err(|e: dbworker::Error| e.to_string())
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    read: ReadArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// Start after this id (the `--after` the previous page printed).
    #[arg(long)]
    after: Option<i64>,
    /// Rows per page.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Newest (or highest) first. The default with --failure or --field,
    /// so a search reaches recent failures on its first page.
    #[arg(long, conflicts_with = "oldest")]
    newest: bool,
    /// Oldest (or lowest) first. The default without --failure or --field.
    #[arg(long)]
    oldest: bool,
    /// Sort by id, queued_at, finished_at or failures (ties by id).
    #[arg(long, default_value = "id", value_parser = parse_sort)]
    sort: JobSort,
    /// With a sort other than id: the `--after-value` the previous page printed.
    #[arg(long)]
    after_value: Option<String>,
    #[command(flatten)]
    format: FormatArg,
}

fn parse_sort(s: &str) -> std::result::Result<JobSort, String> {
    s.parse().map_err(|e: dbworker::Error| e.to_string())
}

pub(crate) async fn list(args: ListArgs) -> Result<()> {
    let pool = args
        .table
        .target
        .database
        .connect_reads(&args.read, 1)
        .await?;
    let admin = args
        .table
        .admin_with(&pool, |o| args.filter.describe(o))
        .await?;
    let mut page = PageRequest::first(args.limit);
    page.after = args.after;
    let searching = args.filter.failure.is_some() || !args.filter.fields.is_empty();
    page.newest_first = args.newest || (searching && !args.oldest);
    page.sort = args.sort;
    page.after_value = args.after_value.clone();
    let page = admin
        .list(&args.filter.filter(&admin)?, page)
        .await
        .context("listing jobs")?;
    if args.format.format == Format::Json {
        return print_json(&json::page(&page));
    }
    println!(
        "{:>10} {:<10} {:<14} {:<14} {:>8} {:>10} {:<16} failure",
        "id", "state", "queue", "kind", "failures", "age", "host"
    );
    for job in &page.jobs {
        let failure = job.failure_message.as_deref().unwrap_or("");
        println!(
            "{:>10} {:<10} {:<14} {:<14} {:>8} {:>10} {:<16} {}",
            job.id,
            job.state.as_str(),
            // Names come from whoever enqueued: no escape sequence of
            // theirs reaches the operator's terminal.
            super::text::printable(job.queue.as_deref().unwrap_or("-")),
            super::text::printable(job.kind.as_deref().unwrap_or("-")),
            job.num_failures,
            format_age(job.age_seconds),
            super::text::printable(&job.worker_hostname),
            super::text::one_line(failure, 60),
        );
    }
    if let (Some(rows), Some(next)) = (page.searched, page.next) {
        println!(
            "searched {rows} rows down to id {next}, no more matches yet; more: --after {next}"
        );
        return Ok(());
    }
    match (page.next, &page.next_value) {
        (Some(next), Some(value)) => println!(
            "more: --after {next} --after-value '{}'",
            super::text::printable(value)
        ),
        (Some(next), None) => println!("more: --after {next}"),
        (None, _) => println!("({} job(s), end of list)", page.jobs.len()),
    }
    Ok(())
}

/// The text on one line, cut to `max` characters.
#[derive(Debug, Args)]
pub(crate) struct JobArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    read: ReadArgs,
    /// The job's id.
    id: i64,
    #[command(flatten)]
    format: FormatArg,
}

pub(crate) async fn show(args: JobArgs) -> Result<()> {
    let (_, admin) = args.table.reader(&args.read).await?;
    match admin
        .show(args.id)
        .await
        .with_context(|| format!("reading job {}", args.id))?
    {
        Some(row) if args.format.format == Format::Json => print_json(&row),
        Some(row) => {
            let text = serde_json::to_string_pretty(&readable(row))
                .with_context(|| format!("job {} as JSON", args.id))?;
            println!("{}", super::text::json(&text));
            Ok(())
        }
        None => Err(not_found(format!("no job {}", args.id))),
    }
}

/// The tag a fair table gives a job waiting for its run-at: behind every
/// tagged job until it comes due (the library's `FAIR_UNTAGGED`, 2^62).
const FAIR_UNTAGGED: i64 = 1 << 62;

/// `show`'s row for a reader: an untagged job's fair tag in words, not as
/// 4611686018427387904 (`--format json` keeps the stored number).
fn readable(mut row: serde_json::Value) -> serde_json::Value {
    if let Some(tag) = row.get_mut("fair_tag")
        && tag.as_i64().is_some_and(|t| t >= FAIR_UNTAGGED)
    {
        *tag = "untagged (not due yet)".into();
    }
    row
}

/// One job by id, or every job matching a filter.
#[derive(Debug, Args)]
pub(crate) struct ActionArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The job's id; without it, every job matching the filter flags.
    id: Option<i64>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Act on every matching job without asking.
    #[arg(long)]
    yes: bool,
    /// Jobs per statement in a bulk action (each a short transaction).
    #[arg(long, default_value_t = 500)]
    chunk_size: u32,
    /// With `fail`: the failure message recorded.
    #[arg(long, default_value = dbworker::admin::DEFAULT_FAIL_MESSAGE)]
    message: String,
}

pub(crate) async fn act(verb: &str, args: ActionArgs) -> Result<()> {
    let pool = args.table.target.connect().await?;
    let admin = args
        .table
        .admin_with(&pool, |o| args.filter.describe(o))
        .await?;
    let action = verb.parse::<BulkAction>()?.with_message(&args.message);
    check_grants(&admin, &action).await?;
    run(&admin, &action, &args).await
}

/// Refuses to start without the grants `action` uses, naming each.
async fn check_grants(admin: &Admin, action: &BulkAction) -> Result<()> {
    match action {
        BulkAction::Delete => admin.check_deletes().await?,
        _ => admin.check_actions().await?,
    }
    Ok(())
}

/// One job by id, or every job matching the filter.
async fn run(admin: &Admin, action: &BulkAction, args: &ActionArgs) -> Result<()> {
    let filter = args.filter.filter(admin)?;
    match args.id {
        Some(id) if filter.is_restricted() => Err(usage(format!(
            "give a job id or filter flags, not both (job {id})"
        ))),
        Some(id) => act_on_one(admin, action, id).await,
        None if !filter.is_restricted() => Err(usage(format!(
            "give a job id, or filter flags (--state, --queue, --kind, --field, ...) to {} every matching job",
            action.verb()
        ))),
        None => act_on_matching(admin, action, &filter, args.yes, args.chunk_size).await,
    }
}

/// `reschedule`: the action's flags plus the new scheduling values.
#[derive(Debug, Args)]
pub(crate) struct RescheduleArgs {
    #[command(flatten)]
    action: ActionArgs,
    /// Run no earlier than this instant (RFC 3339: 2030-01-01T09:00:00Z).
    #[arg(long, value_parser = parse_instant, conflicts_with = "run_in")]
    run_at: Option<SystemTime>,
    /// Run no earlier than this long from now (`10m`, `2h`; database clock).
    #[arg(long, value_parser = duration, alias = "run-in-secs")]
    run_in: Option<Duration>,
    /// The new priority (needs the priority column, --priority-column).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Failures counted so far (`num_failures`): 0 gives every retry back.
    #[arg(long, visible_alias = "num-failures", value_parser = clap::value_parser!(i32).range(0..))]
    attempts: Option<i32>,
    /// The job's own retry limit (the `max_retries` column).
    #[arg(long, conflicts_with = "max_attempts", value_parser = clap::value_parser!(i32).range(0..))]
    max_retries: Option<i32>,
    /// Attempts allowed in all: sets the retry limit to this minus one.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    max_attempts: Option<i32>,
    /// The priority column (used with --priority).
    #[arg(long, default_value = "priority")]
    priority_column: String,
    /// The retry limit column (used with --max-retries or --max-attempts).
    #[arg(long, default_value = "max_retries")]
    max_retries_column: String,
}

fn parse_instant(s: &str) -> std::result::Result<SystemTime, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(SystemTime::from)
        .map_err(|e| format!("{s:?} is not an RFC 3339 instant (2030-01-01T09:00:00Z): {e}"))
}

pub(crate) async fn reschedule(args: RescheduleArgs) -> Result<()> {
    let mut r = Reschedule::default();
    r.run_at = args.run_at;
    r.run_after = args.run_in;
    r.priority = args.priority;
    r.num_failures = args.attempts;
    r.max_retries = args.max_retries.or(args.max_attempts.map(|n| n - 1));
    let pool = args.action.table.target.connect().await?;
    let admin = args
        .action
        .table
        .admin_with(&pool, |o| {
            args.action.filter.describe(o);
            if r.priority.is_some() {
                o.priority_column = Some(args.priority_column.clone());
            }
            if r.max_retries.is_some() {
                o.max_retries_column = Some(args.max_retries_column.clone());
            }
        })
        .await?;
    let action = BulkAction::Reschedule(r);
    check_grants(&admin, &action).await?;
    run(&admin, &action, &args.action).await
}

/// `remove --key`: the waiting job holding a key.
#[derive(Debug, Args)]
pub(crate) struct RemoveArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The key whose queued or errored job is deleted.
    #[arg(long)]
    key: String,
    /// The job key column.
    #[arg(long, env = "DBWORKER_KEY_COLUMN", default_value = "job_key")]
    key_column: String,
}

pub(crate) async fn remove(args: RemoveArgs) -> Result<()> {
    let pool = args.table.target.connect().await?;
    let admin = args
        .table
        .admin_with(&pool, |o| o.key_column = Some(args.key_column.clone()))
        .await?;
    admin.check_deletes().await?;
    let key = &args.key;
    match admin
        .remove_key(key)
        .await
        .with_context(|| format!("removing the job with key {key:?}"))?
    {
        Removed::Deleted(id) => println!("removed job {id} (key {key:?})"),
        Removed::Processing(id) => println!(
            "job {id} held key {key:?} and is processing: it runs on without the key, and is not retried if it fails (with a retry-limit column)"
        ),
        _ => {
            return Err(not_found(format!(
                "no queued or errored job holds key {key:?}"
            )));
        }
    }
    Ok(())
}

async fn act_on_one(admin: &Admin, action: &BulkAction, id: i64) -> Result<()> {
    let doing = || format!("{} job {id}", action.verb());
    // What was done, or why the job was left alone if it exists.
    let (done, refusal) = match action {
        BulkAction::Requeue => (
            (admin.requeue(id).await.with_context(doing)?).then(|| format!("requeued job {id}")),
            "is not failed, canceled or errored",
        ),
        BulkAction::Delete => (
            (admin.delete(id).await.with_context(doing)?).then(|| format!("deleted job {id}")),
            "is processing: a worker holds it",
        ),
        BulkAction::Fail(message) => (
            (admin.fail(id, message).await.with_context(doing)?)
                .then(|| format!("failed job {id}")),
            "is not queued or errored",
        ),
        BulkAction::Complete | BulkAction::Reschedule(_) => {
            let past = if *action == BulkAction::Complete {
                "completed"
            } else {
                "rescheduled"
            };
            let acted = admin.act_on_ids(&[id], action).await.with_context(doing)? == 1;
            (
                acted.then(|| format!("{past} job {id}")),
                "is not queued, errored, failed or canceled (a processing job is left alone)",
            )
        }
        _ => (
            match admin.cancel(id).await.with_context(doing)? {
                Canceled::Now => Some(format!("canceled job {id}")),
                Canceled::Requested => Some(format!(
                    "asked the worker of job {id} to cancel it (at its next heartbeat)"
                )),
                _ => None,
            },
            "is not queued, errored or processing",
        ),
    };
    if let Some(line) = done {
        println!("{line}");
        return Ok(());
    }
    // The statements match no row either way: tell a missing job apart.
    if admin.show(id).await.with_context(doing)?.is_none() {
        return Err(not_found(format!("no job {id}")));
    }
    Err(refused(format!("job {id} {refusal}")))
}

async fn act_on_matching(
    admin: &Admin,
    action: &BulkAction,
    filter: &JobFilter,
    yes: bool,
    chunk_size: u32,
) -> Result<()> {
    let verb = action.verb();
    let matching = admin
        .matching(filter, action)
        .await
        .with_context(|| format!("counting the jobs to {verb}"))?;
    let count = matching.count;
    if count == 0 {
        println!("no job to {verb} matches");
        return Ok(());
    }
    if !yes && !confirm(&format!("{count} job(s) match; {verb} them? [y/N] "))? {
        return Err(refused(format!(
            "{count} job(s) match; nothing done (pass --yes to {verb} them)"
        )));
    }
    let bar = ProgressBar::new(count).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)")
            .context("the progress bar's template")?
            .progress_chars("=> "),
    );
    bar.set_message(verb.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    // Only the jobs counted: none enqueued after the count (or the answer).
    let mut bounded = filter.clone();
    bounded.max_id = matching.max_id;
    let done = admin
        .act_on_matching(&bounded, action, chunk_size, |done| bar.set_position(done))
        .await;
    bar.finish_and_clear();
    let done = done.with_context(|| format!("{verb} the matching jobs"))?;
    let past = match action {
        BulkAction::Requeue => "requeued",
        BulkAction::Cancel => "canceled (or asked to cancel)",
        BulkAction::Fail(_) => "failed",
        BulkAction::Complete => "completed",
        BulkAction::Reschedule(_) => "rescheduled",
        _ => "deleted",
    };
    println!("{past} {done} job(s)");
    if done < count {
        println!(
            "{done} of the {count} job(s) counted; {} changed state meanwhile and were left alone",
            count - done
        );
    }
    Ok(())
}

/// Asks on the terminal; refuses when no one can answer.
pub(crate) fn confirm(question: &str) -> Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Ok(false);
    }
    eprint!("{question}");
    std::io::stderr()
        .flush()
        .context("asking for confirmation")?;
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .context("reading the confirmation")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
