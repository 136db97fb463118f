//! `dbworker top`: a live terminal view of a job table — jobs per queue and
//! state, jobs finished per second, the oldest wait, and the hosts working.
//! Every refresh runs the status queries (bounded by the partial indexes) and
//! one count of jobs finished within the window.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use dbworker::admin::{Admin, Status};
use ratatui::Frame;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use workerutil::JobState;

use crate::args::{ReadArgs, TableArgs, duration};
use dbworker::admin::format_age;

#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    read: ReadArgs,
    /// Seconds between refreshes.
    #[arg(long, default_value = "1s", value_parser = duration, alias = "interval-secs")]
    interval: Duration,
    /// Jobs per second are averaged over this many seconds.
    #[arg(long, default_value = "10s", value_parser = duration, alias = "window-secs")]
    window: Duration,
    /// Print one frame as text and exit (for scripts, and where there is no terminal).
    #[arg(long)]
    once: bool,
}

/// What one frame shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) table: String,
    pub(crate) status: Status,
    /// Jobs finished per second over the window, per state.
    pub(crate) per_second: Vec<(JobState, f64)>,
    pub(crate) window: Duration,
}

impl Snapshot {
    async fn take(admin: &Admin, table: &str, window: Duration) -> Result<Snapshot> {
        let status = admin
            .status()
            .await
            .with_context(|| format!("status of {table}"))?;
        let recent = admin
            .recent(window)
            .await
            .with_context(|| format!("jobs finished recently in {table}"))?;
        let secs = window.as_secs_f64().max(f64::EPSILON);
        let per_second = [JobState::Completed, JobState::Failed, JobState::Canceled]
            .into_iter()
            .map(|state| {
                let n = recent
                    .iter()
                    .find(|(s, _)| *s == state)
                    .map_or(0, |(_, n)| *n);
                #[allow(clippy::cast_precision_loss)] // counts far below 2^52
                (state, n as f64 / secs)
            })
            .collect();
        Ok(Snapshot {
            table: table.to_owned(),
            status,
            per_second,
            window,
        })
    }
}

/// Draws one frame.
pub(crate) fn render(frame: &mut Frame<'_>, snap: &Snapshot) {
    let queues = snap.status.per_queue();
    let hosts = &snap.status.processing_by_host;
    let [header, rates, queue_area, host_area, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(3),
        Constraint::Min(4),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    frame.render_widget(
        Paragraph::new(Line::from(format!(
            "dbworker top — {}   oldest waiting {}   ~{} rows",
            snap.table,
            format_age(snap.status.oldest_waiting_seconds),
            snap.status.estimated_rows
        )))
        .style(bold),
        header,
    );
    let rate_text = snap
        .per_second
        .iter()
        .map(|(state, r)| format!("{} {r:.1}/s", state.as_str()))
        .collect::<Vec<_>>()
        .join("   ");
    frame.render_widget(
        Paragraph::new(rate_text).block(Block::bordered().title(format!(
            " finished, last {:.0}s ",
            snap.window.as_secs_f64()
        ))),
        rates,
    );
    let queue_rows = queues.iter().map(|q| {
        Row::new([
            q.queue.clone().unwrap_or_else(|| "-".into()),
            q.queued.to_string(),
            q.errored.to_string(),
            q.processing.to_string(),
        ])
    });
    frame.render_widget(
        Table::new(
            queue_rows,
            [
                Constraint::Fill(2),
                Constraint::Fill(1),
                Constraint::Fill(1),
                Constraint::Fill(1),
            ],
        )
        .header(Row::new(["queue", "queued", "errored", "processing"]).style(bold))
        .block(Block::bordered().title(" queues ")),
        queue_area,
    );
    let host_rows = hosts
        .iter()
        .map(|(host, n)| Row::new([host.clone(), n.to_string()]));
    frame.render_widget(
        Table::new(host_rows, [Constraint::Fill(3), Constraint::Fill(1)])
            .header(Row::new(["host", "processing"]).style(bold))
            .block(Block::bordered().title(" processes working ")),
        host_area,
    );
    frame.render_widget(Paragraph::new("q: quit"), footer);
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

pub(crate) async fn top(args: TopArgs) -> Result<()> {
    let (_, admin) = args.table.reader(&args.read).await?;
    let interval = args.interval;
    let window = args.window;
    let table = args.table.target.table.clone();
    if args.once {
        let snap = Snapshot::take(&admin, &table, window).await?;
        print!("{}", render_text(&snap, 100, 30)?);
        return Ok(());
    }
    let mut terminal = ratatui::init();
    let result = live(&mut terminal, &admin, &table, interval, window).await;
    ratatui::restore();
    result
}

async fn live(
    terminal: &mut ratatui::DefaultTerminal,
    admin: &Admin,
    table: &str,
    interval: Duration,
    window: Duration,
) -> Result<()> {
    loop {
        let snap = Snapshot::take(admin, table, window).await?;
        terminal
            .draw(|f| render(f, &snap))
            .context("drawing on the terminal")?;
        let next = Instant::now() + interval;
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
    fn a_frame_shows_queues_rates_and_hosts() {
        let mut status = Status::default();
        let queue = |name: &str, queued, errored, processing| {
            let mut q = QueueCounts::default();
            q.queue = Some(name.into());
            (q.queued, q.errored, q.processing) = (queued, errored, processing);
            q
        };
        status.queues = vec![queue("emails", 120, 0, 4), queue("reports", 0, 2, 0)];
        status.oldest_waiting_seconds = 90.0;
        status.processing_by_host = vec![("host-a".into(), 4)];
        let snap = Snapshot {
            table: "jobs".into(),
            status,
            per_second: vec![(JobState::Completed, 12.5), (JobState::Failed, 0.0)],
            window: Duration::from_secs(10),
        };
        let text = render_text(&snap, 80, 20).unwrap();
        assert!(text.contains("dbworker top — jobs"), "{text}");
        assert!(text.contains("oldest waiting 2m"), "{text}");
        assert!(text.contains("completed 12.5/s"), "{text}");
        let emails = text.lines().find(|l| l.contains("emails")).unwrap();
        let cells: Vec<&str> = emails.split_whitespace().collect();
        assert_eq!(cells, ["│emails", "120", "0", "4", "│"], "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains("host-a") && l.contains('4')),
            "{text}"
        );
    }
}
