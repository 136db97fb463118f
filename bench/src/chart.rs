//! The jobs/s-against-handlers chart, as a small hand-written SVG (no plotting
//! crate to build): a log-scale y axis, so that heartbeat and transactional
//! handling, an order of magnitude apart, both read well.

use std::fmt::Write as _;

use crate::report::Pair;

/// The chart's file name under docs/.
pub(crate) const FILE_NAME: &str = "bench-jobs-per-handler.svg";

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 290.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

struct Series {
    label: String,
    color: &'static str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// The chart for one run, or `None` without burn-downs.
pub(crate) fn render(heartbeat: &[Pair], transactional: &[Pair], date: &str) -> Option<String> {
    let mut series = Vec::new();
    for (name, pairs, color) in [
        ("heartbeat", heartbeat, "#1f77b4"),
        ("transactional", transactional, "#d62728"),
    ] {
        if pairs.is_empty() {
            continue;
        }
        let floor_label = match name {
            "heartbeat" => format!(
                "heartbeat floor ({} conns, 100/stmt)",
                pairs[0].floor.connections
            ),
            _ => "transactional floor (same concurrency)".to_owned(),
        };
        series.push(Series {
            label: format!("{name} handling, dbworker"),
            color,
            dashed: false,
            points: pairs
                .iter()
                .map(|p| (p.handlers as f64, p.framework.rate()))
                .collect(),
        });
        series.push(Series {
            label: floor_label,
            color,
            dashed: true,
            points: pairs
                .iter()
                .map(|p| (p.handlers as f64, p.floor.rate()))
                .collect(),
        });
    }
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.clone()).collect();
    if all.is_empty() {
        return None;
    }
    let x_max = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let y_min = all
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let y_max = all.iter().map(|p| p.1).fold(1.0, f64::max);
    let (lo, hi) = (
        y_min.log10().floor(),
        y_max.log10().ceil().max(y_min.log10().floor() + 1.0),
    );

    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |v: f64| LEFT + v / (x_max * 1.05) * plot_w;
    let y = |v: f64| TOP + plot_h - (v.max(1.0).log10() - lo) / (hi - lo) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="14">No-op jobs/s against handler count, {date}</text>"#
    );
    // Y grid: 1, 2, 5 × 10^k.
    let mut decade = 10f64.powf(lo);
    while decade <= 10f64.powf(hi) * 1.001 {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v < 10f64.powf(lo) * 0.999 || v > 10f64.powf(hi) * 1.001 {
                continue;
            }
            let yy = y(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                yy + 4.0,
                tick(v)
            );
        }
        decade *= 10.0;
    }
    // X ticks at the handler counts measured.
    let mut xs: Vec<f64> = all.iter().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for v in xs {
        let xx = x(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{v}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">handlers (floor: same run, measured right after)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">jobs/s (log scale)</text>"#,
        TOP + plot_h / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let path: Vec<String> = s
            .points
            .iter()
            .map(|(px, py)| format!("{:.1},{:.1}", x(*px), y(*py)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            s.color
        );
        for (px, py) in &s.points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}" stroke="{}" stroke-width="1.5"/>"#,
                x(*px),
                y(*py),
                if s.dashed { "white" } else { s.color },
                s.color
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 14.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 26.0,
            s.color,
            lx + 32.0,
            ly + 4.0,
            s.label
        );
    }
    svg.push_str("</svg>\n");
    Some(svg)
}

/// `500`, `2k`, `50k`.
fn tick(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}
