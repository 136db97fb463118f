//! One measured run and a pair of them (dbworker beside its floor): what
//! every table of the report is made of, with the per-job figures of each.

use std::time::Duration;

use crate::db::{Mode, Statements};
use crate::table::{count, rate};

/// `s`'s WAL bytes per job (`n/a` when not counted).
pub(crate) fn wal_per_job(s: Option<Statements>, jobs: u64) -> String {
    match s {
        // Whole bytes, rounded to the nearest.
        Some(s) => format!("{} B", count((s.wal_bytes + jobs.max(1) / 2) / jobs.max(1))),
        None => "n/a".to_owned(),
    }
}

/// `s`'s statements per job, `all / non-utility` (`n/a` when not counted).
pub(crate) fn statements_per_job(s: Option<Statements>, jobs: u64) -> String {
    match s {
        Some(s) => format!(
            "{} / {}",
            three_digits(s.all as f64 / jobs.max(1) as f64),
            three_digits(s.non_utility as f64 / jobs.max(1) as f64)
        ),
        None => "n/a".to_owned(),
    }
}

/// `x` to three significant digits: batched claims and marks put a small
/// fraction of a statement on each job, which two decimals would round away.
fn three_digits(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = |x: f64| {
        [100.0, 10.0, 1.0, 0.1, 0.01, 0.001]
            .iter()
            .position(|&at_least| x.abs() >= at_least)
            .unwrap_or(6)
    };
    // Rounding can carry into one more digit (9.996 is 10.00): decide again
    // from the rounded value.
    let d = decimals(x);
    let rounded: f64 = format!("{x:.d$}").parse().unwrap_or(x);
    let d = decimals(rounded);
    format!("{rounded:.d$}")
}

/// One measured enqueue into one table (a path, or the slices of a round
/// summed): jobs, time and statements.
#[derive(Debug)]
pub(crate) struct EnqueueRun {
    pub(crate) jobs: u64,
    pub(crate) elapsed: Duration,
    pub(crate) statements: Option<Statements>,
}

impl EnqueueRun {
    pub(crate) fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One measured burn-down (framework or floor).
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) jobs: u64,
    /// From the start to the last completion.
    pub(crate) elapsed: Duration,
    /// Completions in each full second of the run.
    pub(crate) per_second: Vec<u64>,
    pub(crate) statements: Option<Statements>,
    /// Connections it could use.
    pub(crate) connections: u32,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// `all / non-utility` statements per job.
    pub(crate) fn statements_per_job(&self) -> String {
        statements_per_job(self.statements, self.jobs)
    }

    /// WAL bytes per job, rounded.
    pub(crate) fn wal_per_job(&self) -> String {
        wal_per_job(self.statements, self.jobs)
    }

    /// Mean jobs/s over the first and the last few full seconds (up to 10).
    pub(crate) fn first_and_last(&self) -> Option<(f64, f64)> {
        let s = &self.per_second;
        let w = (s.len() / 3).clamp(1, 10);
        if s.len() < 2 {
            return None;
        }
        let mean = |xs: &[u64]| xs.iter().sum::<u64>() as f64 / xs.len() as f64;
        Some((mean(&s[..w]), mean(&s[s.len() - w..])))
    }

    pub(crate) fn series(&self) -> String {
        let parts: Vec<String> = self.per_second.iter().map(|n| rate(*n as f64)).collect();
        if parts.is_empty() {
            "(shorter than a second)".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

/// A framework run and the floor measured right after it.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    pub(crate) mode: Mode,
    pub(crate) handlers: usize,
    /// Completed rows in the table before the run.
    pub(crate) completed_rows: u64,
    pub(crate) framework: Run,
    pub(crate) floor: Run,
}

impl Pair {
    pub(crate) fn new(
        mode: Mode,
        handlers: usize,
        completed_rows: u64,
        framework: Run,
        floor: Run,
    ) -> Pair {
        Pair {
            mode,
            handlers,
            completed_rows,
            framework,
            floor,
        }
    }

    pub(crate) fn ratio(&self) -> f64 {
        self.framework.rate() / self.floor.rate()
    }

    /// One progress line.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} {} handlers{}: dbworker {} jobs/s, floor {} jobs/s, ratio {:.2}",
            self.mode,
            self.handlers,
            if self.completed_rows > 0 {
                format!(", {} completed rows", count(self.completed_rows))
            } else {
                String::new()
            },
            rate(self.framework.rate()),
            rate(self.floor.rate()),
            self.ratio()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::three_digits;

    #[test]
    fn statements_per_job_keep_three_significant_digits() {
        assert_eq!(three_digits(0.0123), "0.0123");
        assert_eq!(three_digits(0.00456), "0.00456");
        assert_eq!(three_digits(4.25), "4.25");
        assert_eq!(three_digits(12.34), "12.3");
        assert_eq!(three_digits(1234.0), "1234");
        assert_eq!(three_digits(0.0), "0");
        assert_eq!(three_digits(9.996), "10.0");
        assert_eq!(three_digits(0.09996), "0.100");
    }
}
