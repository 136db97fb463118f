//! The overview's charts, drawn on the server as inline SVG from the job
//! history (`dbworker::history`): no script, no external asset. Throughput
//! (completed, failed and canceled per step, stacked) and wait and run times
//! (p50 and p95 per step), each with a time axis in UTC, a value axis, and
//! the range's totals; the range is a link (`?range=1h|24h|7d`).

use std::fmt::Write as _;

use maud::{Markup, PreEscaped, html};

use super::Refresh;
use crate::history::{Point, Range, Series};

/// What the overview shows where the charts go.
#[derive(Debug)]
pub(crate) enum Charts {
    /// The table's history over the range asked for.
    Series(Series),
    /// The history table does not exist.
    Missing { history_table: String },
    /// Reading it failed: the cause is logged, not shown (it names tables,
    /// columns and roles to every viewer).
    Failed,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 210.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 26.0;
const BOTTOM: f64 = 34.0;

const COMPLETED: &str = "#4a7fd4";
const FAILED: &str = "#c2453a";
const CANCELED: &str = "#9aa4b5";
const WAIT: &str = "#4a7fd4";
const RUN: &str = "#d08a1c";

/// The chart section of one table on the overview: the range links, then
/// the charts (or how to create the history table).
pub(crate) fn section(table: &str, charts: &Charts, range: Range, refresh: &Refresh) -> Markup {
    let link = |r: Range| match refresh.every {
        Some(e) => format!("?range={}&refresh={e}", r.as_str()),
        None => format!("?range={}", r.as_str()),
    };
    html! {
        p class="ranges" {
            "History: "
            @for (i, r) in Range::ALL.into_iter().enumerate() {
                @if i > 0 { " · " }
                @if r == range { strong { (r.as_str()) } } @else { a href=(link(r)) { (r.as_str()) } }
            }
        }
        @match charts {
            Charts::Series(s) => {
                div class="charts" { (throughput(s)) (times(s)) }
            }
            Charts::Missing { history_table } => {
                p class="notice" {
                    "No history: the table " code { (history_table) } " does not exist. Create it with "
                    code { "dbworker migration --table " (table) " --history" }
                    " and record it with " code { "dbworker history --table " (table) }
                    " (or " code { "dbworker::history::History" } " in a worker process)."
                }
            }
            Charts::Failed => {
                p class="notice" { "The history could not be read (the cause is in the dashboard's log)." }
            }
        }
    }
}

/// The charts of job table `table` over `range`, from `history_table`.
pub(crate) async fn read(
    pool: &sqlx::PgPool,
    history_table: &str,
    table: &str,
    range: Range,
) -> Charts {
    match crate::history::series(pool, history_table, table, range).await {
        Ok(Some(series)) => Charts::Series(series),
        Ok(None) => Charts::Missing {
            history_table: history_table.to_owned(),
        },
        Err(err) => {
            tracing::warn!(table, error = %err, "reading the history failed");
            Charts::Failed
        }
    }
}

/// A step's label on the time axis, in UTC.
fn time_label(at: i64, range: Range) -> String {
    let format = match range {
        Range::Week => "%a %d %b",
        _ => "%H:%M",
    };
    chrono::DateTime::from_timestamp(at, 0)
        .map_or_else(String::new, |t| t.format(format).to_string())
}

/// A bar's time in its hover text, in UTC: with the day where the chart
/// spans days (on the week chart the hour alone names one of seven).
fn tip_label(at: i64, range: Range) -> String {
    let format = match range {
        Range::Hour => "%H:%M",
        _ => "%a %d %b %H:%M",
    };
    chrono::DateTime::from_timestamp(at, 0)
        .map_or_else(String::new, |t| t.format(format).to_string())
}

/// The time axis' ticks: every 10 min, 4 h or day.
fn tick_every(range: Range) -> i64 {
    match range {
        Range::Hour => 600,
        Range::Day => 4 * 3600,
        Range::Week => 86_400,
    }
}

/// The smallest 1, 2 or 5 times a power of ten at least `v` (and above 0).
fn nice_ceiling(v: f64) -> f64 {
    if !v.is_finite() || v <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&n| n >= v * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// Seconds as an operator reads them: `850 ms`, `4.2 s`, `3.5 min`, `2.1 h`.
pub(crate) fn seconds(s: f64) -> String {
    match s {
        s if s <= 0.0 => "0 s".to_owned(),
        s if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        s if s < 60.0 => format!("{s:.1} s"),
        s if s < 3600.0 => format!("{:.1} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// `text` escaped for the SVG written by hand.
fn escape(text: &str) -> String {
    html! { (text) }.into_string()
}

fn count(n: u64) -> String {
    n.to_string()
}

/// The plot's frame: x from the range's first step to its end, y from 0 to
/// `y_max`; draws both axes, the grid, and the labels (`y_label` formats a
/// value of the y axis).
struct Frame<'a> {
    s: &'a Series,
    y_max: f64,
}

impl Frame<'_> {
    fn span(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // seconds: far below 2^52
        let span = (self.s.range.steps() * self.s.range.step().as_secs()) as f64;
        span
    }

    fn x(&self, at: i64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let offset = (at - self.s.from) as f64;
        LEFT + offset / self.span() * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        HEIGHT - BOTTOM - v / self.y_max * (HEIGHT - TOP - BOTTOM)
    }

    fn step_width(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let steps = self.s.range.steps() as f64;
        (WIDTH - LEFT - RIGHT) / steps
    }

    fn axes(&self, out: &mut String, y_label: impl Fn(f64) -> String) {
        let (x0, x1, y0) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM);
        for i in 0..=2 {
            let v = self.y_max * f64::from(i) / 2.0;
            let y = self.y(v);
            let _ = write!(
                out,
                r#"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="currentColor" stroke-opacity="0.15"/><text x="{tx}" y="{ty:.1}" text-anchor="end" font-size="10" fill="currentColor">{label}</text>"#,
                tx = x0 - 4.0,
                ty = y + 3.0,
                label = escape(&y_label(v)),
            );
        }
        let _ = write!(
            out,
            r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="currentColor" stroke-opacity="0.6"/><line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}" stroke="currentColor" stroke-opacity="0.6"/>"#
        );
        let every = tick_every(self.s.range);
        let step = i64::try_from(self.s.range.step().as_secs()).unwrap_or(60);
        let end = self.s.from + i64::try_from(self.s.range.steps()).unwrap_or(0) * step;
        let mut at = self.s.from.div_euclid(every) * every;
        while at <= end {
            if at >= self.s.from {
                let x = self.x(at);
                let _ = write!(
                    out,
                    r#"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="currentColor" stroke-opacity="0.6"/><text x="{x:.1}" y="{ty}" text-anchor="middle" font-size="10" fill="currentColor">{label}</text>"#,
                    y1 = y0 + 4.0,
                    ty = y0 + 15.0,
                    label = time_label(at, self.s.range),
                );
            }
            at += every;
        }
        let _ = write!(
            out,
            r#"<text x="{x1}" y="{ty}" text-anchor="end" font-size="10" fill="currentColor">time (UTC)</text>"#,
            ty = HEIGHT - 4.0,
        );
    }
}

fn svg(label: &str, title: &str, totals: &str, body: &str) -> Markup {
    html! {
        svg class="history" width=(WIDTH) height=(HEIGHT) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(label) {
            text x=(LEFT) y="12" font-size="12" font-weight="600" fill="currentColor" { (title) }
            text x=(LEFT) y="23" font-size="10" fill="currentColor" { (totals) }
            (PreEscaped(body))
        }
    }
}

/// Completed, failed and canceled jobs per step, stacked, with the totals.
fn throughput(s: &Series) -> Markup {
    let per = match s.range {
        Range::Hour => "minute",
        Range::Day => "15 minutes",
        Range::Week => "3 hours",
    };
    let highest = s.points.iter().map(Point::finished).max().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let frame = Frame {
        s,
        y_max: nice_ceiling(highest as f64),
    };
    let mut body = String::new();
    frame.axes(&mut body, |v| format!("{v:.0}"));
    let width = (frame.step_width() * 0.8).max(1.0);
    for p in &s.points {
        let x = frame.x(p.at) + frame.step_width() * 0.1;
        let mut base = 0.0;
        let tip = format!(
            "{} UTC: {} completed, {} failed, {} canceled, {} retried",
            tip_label(p.at, s.range),
            p.completed,
            p.failed,
            p.canceled,
            p.retried
        );
        let _ = write!(body, "<g><title>{}</title>", escape(&tip));
        for (n, colour) in [
            (p.completed, COMPLETED),
            (p.failed, FAILED),
            (p.canceled, CANCELED),
        ] {
            if n == 0 {
                continue;
            }
            #[allow(clippy::cast_precision_loss)]
            let top = base + n as f64;
            let (y, h) = (frame.y(top), frame.y(base) - frame.y(top));
            let _ = write!(
                body,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{h:.1}" fill="{colour}"/>"#
            );
            base = top;
        }
        body.push_str("</g>");
    }
    let t = &s.total;
    let totals = format!(
        "total over {}: completed {} · failed {} · canceled {} · retried {}",
        s.range.as_str(),
        count(t.completed),
        count(t.failed),
        count(t.canceled),
        count(t.retried)
    );
    svg(
        "finished jobs",
        &format!("Finished jobs per {per} (completed, failed, canceled)"),
        &totals,
        &body,
    )
}

/// Reads one time of a point.
type Measure = fn(&Point) -> Option<f64>;

/// Wait and run times per step: p95 as a line, p50 dashed.
fn times(s: &Series) -> Markup {
    let highest = s
        .points
        .iter()
        .flat_map(|p| [p.wait_p95, p.run_p95, p.wait_p50, p.run_p50])
        .flatten()
        .fold(0.0_f64, f64::max);
    let frame = Frame {
        s,
        y_max: nice_ceiling(highest),
    };
    let mut body = String::new();
    frame.axes(&mut body, seconds);
    let half = frame.step_width() / 2.0;
    let lines: [(Measure, &str, &str); 4] = [
        (|p| p.wait_p95, WAIT, ""),
        (|p| p.wait_p50, WAIT, r#" stroke-dasharray="4 3""#),
        (|p| p.run_p95, RUN, ""),
        (|p| p.run_p50, RUN, r#" stroke-dasharray="4 3""#),
    ];
    for (get, colour, dash) in lines {
        let points: Vec<String> = s
            .points
            .iter()
            .filter_map(|p| {
                get(p).map(|v| format!("{:.1},{:.1}", frame.x(p.at) + half, frame.y(v)))
            })
            .collect();
        if !points.is_empty() {
            let _ = write!(
                body,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>"#,
                points.join(" ")
            );
        }
    }
    let legend_y = HEIGHT - 4.0;
    let _ = write!(
        body,
        r#"<text x="{LEFT}" y="{legend_y}" font-size="10" fill="{WAIT}">wait (due → start)</text><text x="{x2}" y="{legend_y}" font-size="10" fill="{RUN}">run (start → finish)</text><text x="{x3}" y="{legend_y}" font-size="10" fill="currentColor">— p95 · - - p50</text>"#,
        x2 = LEFT + 120.0,
        x3 = LEFT + 240.0,
    );
    let t = &s.total;
    let or_none = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), seconds);
    let totals = format!(
        "over {}: wait p50 {} · p95 {} · max {}; run p50 {} · p95 {} · max {}",
        s.range.as_str(),
        or_none(t.wait_p50),
        or_none(t.wait_p95),
        or_none(t.wait_max),
        or_none(t.run_p50),
        or_none(t.run_p95),
        or_none(t.run_max),
    );
    svg(
        "wait and run times",
        "Wait and run time (p50, p95)",
        &totals,
        &body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_round_up_and_seconds_read_well() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(12.0), 20.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(500.0), 500.0);
        assert_eq!(seconds(0.25), "250 ms");
        assert_eq!(seconds(4.25), "4.2 s");
        assert_eq!(seconds(210.0), "3.5 min");
        assert_eq!(time_label(0, Range::Hour), "00:00");
        assert_eq!(time_label(0, Range::Week), "Thu 01 Jan");
        assert_eq!(tip_label(0, Range::Hour), "00:00");
        assert_eq!(tip_label(3 * 3600, Range::Week), "Thu 01 Jan 03:00");
        assert_eq!(tip_label(3 * 3600, Range::Day), "Thu 01 Jan 03:00");
    }
}
