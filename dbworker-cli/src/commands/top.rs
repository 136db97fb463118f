//! `dbworker top`: a live terminal view of a job table — the live states per
//! queue (`Admin::status`, bounded by the partial indexes), what each queue
//! finished over the last window with its wait and run times, and jobs
//! finished per minute over the last hour, both from the job history
//! (`dbworker history` records it), the hosts working and, on a table with
//! progress (`migration --progress` or `--progress-table`), the running jobs
//! with their progress.
//! `--once` prints one frame (or, with `--format json`, one JSON document)
//! and exits.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use dbworker::admin::{Admin, RunningJob, Status, format_age};
use dbworker::history::{self, DEFAULT_HISTORY_TABLE, QueueHistory, Range, Series};
use ratatui::Frame;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::args::{Format, FormatArg, ReadArgs, TableArgs, duration};
use crate::commands::json::{self, print_json};
use crate::commands::text::printable;

#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    read: ReadArgs,
    /// Time between refreshes (`2s`, `500ms`).
    #[arg(long, default_value = "2s", value_parser = duration, alias = "interval-secs")]
    interval: Duration,
    /// Each queue's finished jobs and times are summed over this much of the
    /// history (whole minutes).
    #[arg(long, default_value = "1h", value_parser = duration, alias = "window-secs")]
    window: Duration,
    /// The history table (`dbworker migration --history`).
    #[arg(long, default_value = DEFAULT_HISTORY_TABLE)]
    history_table: String,
    /// Print one frame as text (or JSON) and exit (for scripts, and where
    /// there is no terminal).
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    format: FormatArg,
}

/// What one frame shows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) table: String,
    pub(crate) status: Status,
    /// Each queue's history over the window; `None`: no history table.
    pub(crate) queues: Option<Vec<QueueHistory>>,
    /// The last hour, a point per minute with finished jobs.
    pub(crate) hour: Option<Series>,
    pub(crate) window: Duration,
    pub(crate) history_table: String,
    /// The longest-running jobs with their progress; `None`: the table keeps
    /// no progress (neither the columns nor the side table).
    pub(crate) running: Option<Vec<RunningJob>>,
}

/// How many running jobs a frame lists, longest first.
const RUNNING_ROWS: u32 = 10;

impl Snapshot {
    async fn take(pool: &PgPool, admin: &Admin, table: &str, args: &TopArgs) -> Result<Snapshot> {
        let status = admin
            .status()
            .await
            .with_context(|| format!("status of {table}"))?;
        let h = &args.history_table;
        let queues = history::by_queue(pool, h, table, args.window)
            .await
            .with_context(|| format!("history of {table} in {h}"))?;
        let hour = history::series(pool, h, table, Range::Hour)
            .await
            .with_context(|| format!("history of {table} in {h}"))?;
        let running = if admin.has_progress() {
            let jobs = admin.running(RUNNING_ROWS).await;
            Some(jobs.with_context(|| format!("running jobs of {table}"))?)
        } else {
            None
        };
        Ok(Snapshot {
            table: table.to_owned(),
            status,
            queues,
            hour,
            window: args.window,
            history_table: h.clone(),
            running,
        })
    }

    /// Jobs finished per minute over the last hour, oldest first, a value
    /// for every minute (0 where none finished).
    fn per_minute(&self) -> Vec<u64> {
        let Some(s) = &self.hour else {
            return Vec::new();
        };
        let step = i64::try_from(s.range.step().as_secs()).unwrap_or(60);
        (0..i64::try_from(s.range.steps()).unwrap_or(0))
            .map(|i| {
                let at = s.from + i * step;
                s.points
                    .iter()
                    .find(|p| p.at == at)
                    .map_or(0, history::Point::finished)
            })
            .collect()
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), format_age)
}

/// Draws one frame.
pub(crate) fn render(frame: &mut Frame<'_>, snap: &Snapshot) {
    let status = &snap.status;
    // The running jobs' panel only where there is progress to show.
    let running_rows = match &snap.running {
        Some(_) => Constraint::Min(3),
        None => Constraint::Length(0),
    };
    let [
        header,
        spark_area,
        queue_area,
        host_area,
        running_area,
        footer,
    ] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(5),
        Constraint::Min(4),
        Constraint::Min(3),
        running_rows,
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    frame.render_widget(
        Paragraph::new(Line::from(format!(
            "dbworker top — {}   oldest waiting {}   ~{} rows",
            snap.table,
            format_age(status.oldest_waiting_seconds),
            status.estimated_rows
        )))
        .style(bold),
        header,
    );
    match &snap.hour {
        Some(hour) => {
            let t = &hour.total;
            let title = format!(
                " finished per minute, last hour: completed {} failed {} canceled {} retried {} ",
                t.completed, t.failed, t.canceled, t.retried
            );
            frame.render_widget(
                Sparkline::default()
                    .data(snap.per_minute())
                    .block(Block::bordered().title(title)),
                spark_area,
            );
        }
        None => frame.render_widget(
            Paragraph::new(format!(
                "no history table {}: `dbworker migration --history` creates it, `dbworker history` records it",
                snap.history_table
            ))
            .block(Block::bordered().title(" history ")),
            spark_area,
        ),
    }
    let window = format_age(snap.window.as_secs_f64());
    let mut names: Vec<Option<String>> = status.queues.iter().map(|q| q.queue.clone()).collect();
    for q in snap.queues.iter().flatten() {
        if !names.contains(&q.queue) {
            names.push(q.queue.clone());
        }
    }
    names.sort();
    let queue_rows = names.iter().map(|name| {
        let live = status.queues.iter().find(|q| q.queue == *name);
        let done = snap.queues.iter().flatten().find(|q| q.queue == *name);
        let n = |f: fn(&dbworker::admin::QueueCounts) -> u64| live.map_or(0, f).to_string();
        let d = |f: fn(&history::Point) -> u64| done.map_or(0, |q| f(&q.point)).to_string();
        Row::new([
            printable(name.as_deref().unwrap_or("-")),
            n(|q| q.available),
            n(|q| q.scheduled),
            n(|q| q.errored),
            n(|q| q.processing),
            n(|q| q.stalled),
            d(|p| p.completed),
            d(|p| p.failed),
            d(|p| p.retried),
            secs(done.and_then(|q| q.point.wait_p95)),
            secs(done.and_then(|q| q.point.run_p95)),
        ])
    });
    let widths = [Constraint::Fill(3)]
        .into_iter()
        .chain(std::iter::repeat_n(Constraint::Fill(2), 10));
    frame.render_widget(
        Table::new(queue_rows, widths)
            .header(
                Row::new([
                    "queue", "avail", "sched", "errored", "running", "stalled", "done", "failed",
                    "retried", "wait p95", "run p95",
                ])
                .style(bold),
            )
            .block(Block::bordered().title(format!(
                " queues: live now; done, failed, retried and times over the last {window} "
            ))),
        queue_area,
    );
    let host_rows = status
        .processing_by_host
        .iter()
        .map(|(host, n)| Row::new([printable(host), n.to_string()]));
    frame.render_widget(
        Table::new(host_rows, [Constraint::Fill(3), Constraint::Fill(1)])
            .header(Row::new(["host", "processing"]).style(bold))
            .block(Block::bordered().title(" processes working ")),
        host_area,
    );
    if let Some(running) = &snap.running {
        render_running(frame, running_area, running);
    }
    frame.render_widget(Paragraph::new("q: quit"), footer);
}

/// The running jobs, longest first: id, host, time running, progress as
/// one line of JSON.
fn render_running(frame: &mut Frame<'_>, area: ratatui::layout::Rect, running: &[RunningJob]) {
    let rows = running.iter().map(|j| {
        let progress = j
            .progress
            .as_ref()
            .map_or_else(|| "-".to_owned(), |p| p.to_string());
        Row::new([
            j.id.to_string(),
            printable(&j.worker_hostname),
            format_age(j.running_for.as_secs_f64()),
            progress,
        ])
    });
    let widths = [
        Constraint::Length(10),
        Constraint::Fill(2),
        Constraint::Length(10),
        Constraint::Fill(5),
    ];
    let bold = Style::default().add_modifier(Modifier::BOLD);
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["id", "host", "running", "progress"]).style(bold))
            .block(Block::bordered().title(format!(
                " running jobs, longest first (at most {RUNNING_ROWS}), with their progress "
            ))),
        area,
    );
}

/// The frame as text, `width` × `height` characters.
pub(crate) fn render_text(snap: &Snapshot, width: u16, height: u16) -> Result<String> {
    let mut terminal = ratatui::Terminal::new(TestBackend::new(width, height))
        .context("a text buffer for the frame")?;
    terminal
        .draw(|f| render(f, snap))
        .context("drawing the frame")?;
    let buffer = terminal.backend().buffer();
    let mut text = String::new();
    for y in 0..buffer.area.height {
        let line: String = (0..buffer.area.width)
            .map(|x| buffer[(x, y)].symbol())
            .collect();
        text.push_str(line.trim_end());
        text.push('\n');
    }
    Ok(text)
}

/// `dbworker top --once --format json`: the status as `dbworker status`
/// prints it, and the history (null without a history table).
pub(crate) fn to_json(snap: &Snapshot) -> Value {
    json!({
        "status": json::status(&snap.table, &snap.status, None),
        "history_table": snap.history_table,
        "window_seconds": snap.window.as_secs_f64(),
        "queues": snap.queues,
        "last_hour": snap.hour,
        "running": snap.running.as_ref().map(|jobs| {
            jobs.iter()
                .map(|j| json!({
                    "id": j.id,
                    "worker_hostname": j.worker_hostname,
                    "running_seconds": j.running_for.as_secs_f64(),
                    "progress": j.progress,
                }))
                .collect::<Vec<_>>()
        }),
    })
}

pub(crate) async fn top(args: TopArgs) -> Result<()> {
    // Reads only: from the replica when --replica-url names one.
    let pool = args
        .table
        .target
        .database
        .connect_reads(&args.read, 1)
        .await?;
    let job_table = args.table.job_table_with(&pool, |_| {}).await?;
    let admin = Admin::new(&pool, &job_table)
        .await
        .with_context(|| format!("job table {}", args.table.target.table))?;
    // The name the history records the table under.
    let table = job_table.name();
    if args.once {
        let snap = Snapshot::take(&pool, &admin, &table, &args).await?;
        return match args.format.format {
            Format::Json => print_json(&to_json(&snap)),
            Format::Text => {
                print!("{}", render_text(&snap, 110, 30)?);
                Ok(())
            }
        };
    }
    let mut terminal = ratatui::init();
    let result = live(&mut terminal, &pool, &admin, &table, &args).await;
    ratatui::restore();
    result
}

async fn live(
    terminal: &mut ratatui::DefaultTerminal,
    pool: &PgPool,
    admin: &Admin,
    table: &str,
    args: &TopArgs,
) -> Result<()> {
    loop {
        let snap = Snapshot::take(pool, admin, table, args).await?;
        terminal
            .draw(|f| render(f, &snap))
            .context("drawing on the terminal")?;
        let next = Instant::now() + args.interval;
        while let Some(left) = next.checked_duration_since(Instant::now()) {
            if event::poll(left.min(Duration::from_millis(100))).context("waiting for a key")?
                && let Event::Key(key) = event::read().context("reading a key")?
                && key.kind == KeyEventKind::Press
                && matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
            {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use dbworker::admin::QueueCounts;

    use super::*;

    #[test]
    fn a_frame_shows_live_queues_their_history_and_hosts() {
        let mut status = Status::default();
        let queue = |name: &str, available, errored, processing| {
            let mut q = QueueCounts::default();
            q.queue = Some(name.into());
            (q.available, q.errored, q.processing) = (available, errored, processing);
            q
        };
        status.queues = vec![queue("emails", 120, 0, 4), queue("reports", 0, 2, 0)];
        status.oldest_waiting_seconds = 90.0;
        status.processing_by_host = vec![("host-a".into(), 4)];
        let snap = Snapshot {
            table: "jobs".into(),
            status,
            queues: None,
            hour: None,
            window: Duration::from_secs(3600),
            history_table: "dbworker_history".into(),
            running: None,
        };
        let text = render_text(&snap, 110, 20).unwrap();
        assert!(text.contains("dbworker top — jobs"), "{text}");
        assert!(text.contains("oldest waiting 2m"), "{text}");
        assert!(text.contains("no history table dbworker_history"), "{text}");
        let emails = text.lines().find(|l| l.contains("emails")).unwrap();
        let cells: Vec<&str> = emails.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "│emails",
                "120",
                "0",
                "0",
                "4",
                "0",
                "0",
                "0",
                "0",
                "-",
                "-",
                "│"
            ],
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("host-a") && l.contains('4')),
            "{text}"
        );
    }
}
