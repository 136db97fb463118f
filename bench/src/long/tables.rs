//! The workload's tables: each round's figures beside the plain path's,
//! their ratio, and the medians over the rounds.

use std::time::Duration;

use super::attempts::BurnRounds;
use super::checkpoints::CheckpointRounds;
use super::signals::{SignalRounds, Waits};
use super::traces::EnqueueRounds;
use super::traces::Shape;
use super::{CONTEXT_READS, LongReport, median, ratio};
use crate::report::{count, rate, wal_per_job};
use crate::table::{Table, met, ms};

/// The target for trace capture: at most 2 % of enqueue throughput.
const CAPTURE_TARGET: f64 = 0.98;
/// The target for signal → resume with LISTEN: p99 ≤ 50 ms.
const RESUME_P99_TARGET: Duration = Duration::from_millis(50);

/// The tables of one run of the workload.
pub(crate) fn tables(r: &LongReport) -> Vec<Table> {
    let mut tables = Vec::new();
    if !r.enqueues.is_empty() {
        tables.push(enqueues(&r.enqueues));
    }
    tables.push(context_read(r));
    tables.push(attempts(&r.attempts));
    tables.push(signals(&r.signals));
    if !r.checkpoints.is_empty() {
        tables.push(checkpoints(&r.checkpoints));
    }
    tables
}

/// "plain first" or "feature first".
fn order(plain_first: bool, feature: &str) -> String {
    if plain_first {
        format!("plain, then {feature}")
    } else {
        format!("{feature}, then plain")
    }
}

fn enqueues(all: &[EnqueueRounds]) -> Table {
    let mut rows = Vec::new();
    for e in all {
        let jobs = e.rounds.first().map_or(0, |r| r.plain.jobs);
        for (i, r) in e.rounds.iter().enumerate() {
            rows.push(vec![
                e.shape.label(),
                format!("{}", i + 1),
                format!(
                    "{} slices, alternating, {} first",
                    e.slices,
                    if r.plain_first { "plain" } else { "traced" }
                ),
                count(jobs),
                rate(r.plain.rate()),
                rate(r.traced.rate()),
                format!("{:.3}", r.ratio()),
                wal_per_job(r.plain.statements, r.plain.jobs),
                wal_per_job(r.traced.statements, r.traced.jobs),
            ]);
        }
        let med_ratio = median(e.rounds.iter().map(|r| r.ratio()));
        rows.push(vec![
            e.shape.label(),
            "median".into(),
            format!(
                "capture ≤ 2 % (ratio ≥ {CAPTURE_TARGET}): {}",
                met(med_ratio >= CAPTURE_TARGET)
            ),
            count(jobs),
            rate(median(e.rounds.iter().map(|r| r.plain.rate()))),
            rate(median(e.rounds.iter().map(|r| r.traced.rate()))),
            format!("{med_ratio:.3}"),
            String::new(),
            String::new(),
        ]);
    }
    let tasks = all.first().map_or(0, |e| e.tasks);
    Table {
        title: format!(
            "Long jobs: trace capture on enqueue, from {tasks} tasks at once: a table with traces, each task inside a span exported through tracing-opentelemetry (no-op exporter), beside the plain table with no OpenTelemetry subscriber"
        ),
        headers: vec![
            "path",
            "round",
            "order",
            "jobs",
            "plain jobs/s",
            "traced jobs/s",
            "traced ÷ plain",
            "WAL/job plain",
            "WAL/job traced",
        ],
        rows,
    }
}

fn context_read(r: &LongReport) -> Table {
    // A single enqueue's time as each task saw it: tasks ÷ jobs/s.
    let single = r.enqueues.iter().find(|e| e.shape == Shape::Single);
    let per_enqueue = single.map(|e| {
        let plain = median(e.rounds.iter().map(|r| r.plain.rate()));
        Duration::from_secs_f64(e.tasks as f64 / plain.max(1e-9))
    });
    let row = match r.context_read {
        Some(per_call) => vec![
            count(u64::from(CONTEXT_READS)),
            format!("{:.3} µs", per_call.as_secs_f64() * 1e6),
            per_enqueue.map_or("n/a".into(), ms),
            per_enqueue.map_or("n/a".into(), |e| {
                format!("{:.3} %", 100.0 * per_call.as_secs_f64() / e.as_secs_f64())
            }),
        ],
        None => vec![
            count(u64::from(CONTEXT_READS)),
            "not measured: the span had no valid context".into(),
            String::new(),
            String::new(),
        ],
    };
    Table {
        title: "Long jobs: reading the current span's context (TraceContext::current() inside a span exported through tracing-opentelemetry, in this process, no database), beside one single enqueue's time per task (plain, median)".into(),
        headers: vec!["calls", "per call", "one enqueue per task", "share"],
        rows: vec![row],
    }
}

fn signals(s: &SignalRounds) -> Table {
    let secs = |d: Duration| d.as_secs_f64();
    let row = |label: String, order: String, plain: &Waits, resumed: &Waits| {
        vec![
            label,
            order,
            plain.summary(),
            resumed.summary(),
            ratio(secs(resumed.p50()), secs(plain.p50())),
            ratio(secs(resumed.p99()), secs(plain.p99())),
            format!(
                "{} ({})",
                ms(resumed.p99()),
                met(resumed.p99() <= RESUME_P99_TARGET)
            ),
        ]
    };
    let mut rows: Vec<Vec<String>> = s
        .rounds
        .iter()
        .enumerate()
        .map(|(i, r)| {
            row(
                format!("{}", i + 1),
                order(r.plain_first, "signals"),
                &r.plain,
                &r.resumed,
            )
        })
        .collect();
    let med = |f: fn(&Waits) -> Duration, of: fn(&super::signals::SignalRound) -> &Waits| {
        Duration::from_secs_f64(median(s.rounds.iter().map(|r| secs(f(of(r))))))
    };
    let (plain_p50, plain_p99) = (med(Waits::p50, |r| &r.plain), med(Waits::p99, |r| &r.plain));
    let (resumed_p50, resumed_p99) = (
        med(Waits::p50, |r| &r.resumed),
        med(Waits::p99, |r| &r.resumed),
    );
    rows.push(vec![
        "median of the rounds (ratios: of the rounds' ratios)".into(),
        String::new(),
        format!(
            "{} / {} / {}",
            ms(plain_p50),
            ms(plain_p99),
            ms(med(Waits::max, |r| &r.plain))
        ),
        format!(
            "{} / {} / {}",
            ms(resumed_p50),
            ms(resumed_p99),
            ms(med(Waits::max, |r| &r.resumed))
        ),
        ratio_median(s, |r| (secs(r.resumed.p50()), secs(r.plain.p50()))),
        ratio_median(s, |r| (secs(r.resumed.p99()), secs(r.plain.p99()))),
        format!(
            "{} ({})",
            ms(resumed_p99),
            met(resumed_p99 <= RESUME_P99_TARGET)
        ),
    ]);
    let plain = Waits::pooled(s.rounds.iter().map(|r| &r.plain));
    let resumed = Waits::pooled(s.rounds.iter().map(|r| &r.resumed));
    rows.push(row(
        format!("all rounds pooled ({} each)", count(plain.0.len() as u64)),
        String::new(),
        &plain,
        &resumed,
    ));
    Table {
        title: format!(
            "Long jobs: signal → resumed handler start beside insert → handler start (heartbeat handling, {} handlers, LISTEN on; {} jobs of each per round, {:.0} sends or inserts per second from one connection)",
            s.handlers,
            count(s.jobs as u64),
            s.rate
        ),
        headers: vec![
            "round",
            "order",
            "insert → start p50 / p99 / max",
            "signal → resumed start p50 / p99 / max",
            "p50 signal ÷ insert",
            "p99 signal ÷ insert",
            "signal p99 ≤ 50 ms",
        ],
        rows,
    }
}

/// The median of the rounds' `(a, b) → a ÷ b`.
fn ratio_median(
    s: &SignalRounds,
    pick: impl Fn(&super::signals::SignalRound) -> (f64, f64),
) -> String {
    let m = median(s.rounds.iter().map(|r| {
        let (a, b) = pick(r);
        a / b.max(1e-12)
    }));
    format!("{m:.3}")
}

fn checkpoints(all: &[CheckpointRounds]) -> Table {
    let mut rows = Vec::new();
    let per_checkpoint = |c: &CheckpointRounds, r: &super::checkpoints::CheckpointRound| {
        c.statements_per_checkpoint(r)
            .map_or(("n/a".to_owned(), "n/a".to_owned()), |(all, non, wal)| {
                (format!("{all:.2} / {non:.2}"), format!("{wal:.0} B"))
            })
    };
    for c in all {
        let mut saves = Vec::new();
        for (i, r) in c.rounds.iter().enumerate() {
            let mut calls = r.checkpointed.saves.clone();
            calls.sort();
            saves.extend_from_slice(&calls);
            let (stmts, wal) = per_checkpoint(c, r);
            rows.push(vec![
                c.mode.to_string(),
                format!("{}", i + 1),
                order(r.plain_first, "checkpoints"),
                rate(c.rate(&r.plain)),
                rate(c.rate(&r.checkpointed)),
                ratio(c.rate(&r.checkpointed), c.rate(&r.plain)),
                format!("{:.2} ms", c.per_checkpoint(r) * 1000.0),
                format!(
                    "{} / {}",
                    ms(crate::latency::percentile(&calls, 50)),
                    ms(crate::latency::percentile(&calls, 99))
                ),
                stmts,
                wal,
            ]);
        }
        saves.sort();
        let med_stmts = |k: usize| {
            median(
                c.rounds
                    .iter()
                    .filter_map(|r| c.statements_per_checkpoint(r))
                    .map(|t| [t.0, t.1, t.2][k]),
            )
        };
        rows.push(vec![
            c.mode.to_string(),
            "median".into(),
            String::new(),
            rate(median(c.rounds.iter().map(|r| c.rate(&r.plain)))),
            rate(median(c.rounds.iter().map(|r| c.rate(&r.checkpointed)))),
            format!(
                "{:.3}",
                median(
                    c.rounds
                        .iter()
                        .map(|r| c.rate(&r.checkpointed) / c.rate(&r.plain).max(1e-9))
                )
            ),
            format!(
                "{:.2} ms",
                median(c.rounds.iter().map(|r| c.per_checkpoint(r))) * 1000.0
            ),
            format!(
                "{} / {} (all calls)",
                ms(crate::latency::percentile(&saves, 50)),
                ms(crate::latency::percentile(&saves, 99))
            ),
            format!("{:.2} / {:.2}", med_stmts(0), med_stmts(1)),
            format!("{:.0} B", med_stmts(2)),
        ]);
    }
    let sizes = all.first().map(|c| c.sizes);
    Table {
        title: format!(
            "Long jobs: checkpoint cost, one job writing {} chunks of {} rows (INSERT … SELECT) with a save_checkpoint after each, beside the same job without checkpoints",
            sizes.map_or(0, |s| s.chunks),
            count(sizes.map_or(0, |s| s.items))
        ),
        headers: vec![
            "handling",
            "round",
            "order",
            "items/s without",
            "items/s with",
            "with ÷ without",
            "job time more per checkpoint",
            "save_checkpoint call p50 / p99",
            "stmts more per checkpoint (all / non-utility)",
            "WAL more per checkpoint",
        ],
        rows,
    }
}

fn attempts(a: &BurnRounds) -> Table {
    let per_job = |b: &super::attempts::Burn| {
        b.statements_per_job()
            .map_or("n/a".to_owned(), |(all, non)| {
                format!("{all:.3} / {non:.3}")
            })
    };
    let mut rows: Vec<Vec<String>> = a
        .rounds
        .iter()
        .enumerate()
        .map(|(i, r)| {
            vec![
                format!("{}", i + 1),
                order(r.plain_first, "traced"),
                rate(r.plain.rate()),
                rate(r.traced.rate()),
                ratio(r.traced.rate(), r.plain.rate()),
                per_job(&r.plain),
                per_job(&r.traced),
            ]
        })
        .collect();
    rows.push(vec![
        "median".into(),
        String::new(),
        rate(median(a.rounds.iter().map(|r| r.plain.rate()))),
        rate(median(a.rounds.iter().map(|r| r.traced.rate()))),
        format!("{:.3}", median(a.rounds.iter().map(|r| r.ratio()))),
        String::new(),
        String::new(),
    ]);
    Table {
        title: format!(
            "Traced attempts: a heartbeat burn-down at {} handlers, the traced table beside the plain one, both under an exporting subscriber",
            a.handlers
        ),
        headers: vec![
            "round",
            "order",
            "plain jobs/s",
            "traced jobs/s",
            "traced ÷ plain",
            "statements per job, plain (all / non-utility)",
            "traced",
        ],
        rows,
    }
}
