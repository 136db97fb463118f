//! Result tables, printed as text and written as Markdown, and the number
//! formats they use.

use std::fmt::Write as _;
use std::time::Duration;

/// A titled table, rendered as aligned text or Markdown.
pub(crate) struct Table {
    pub(crate) title: String,
    pub(crate) headers: Vec<&'static str>,
    pub(crate) rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn text(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = format!("{}\n", self.title);
        out.push_str(&line(self.headers.clone()));
        out.push('\n');
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&rule.join("  "));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
            out.push('\n');
        }
        out
    }

    pub(crate) fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n| {} |\n", self.title, self.headers.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.headers.len()));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// Jobs per second, rounded for reading: `31.2k`, `2,480`.
pub(crate) fn rate(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1}k", x / 1000.0)
    } else {
        count(round(x))
    }
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "a rate, rounded for display"
)]
pub(crate) fn round(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// A count with thousands separators.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "no" }
}
