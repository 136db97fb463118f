//! Results: the tables on stdout, and the record in docs/ (written by
//! `docs_merge`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::Result;
use crate::db::Bench;
use crate::framework::Rss;
use crate::latency::Latency;
use crate::machine::Machine;
use crate::provenance::code_version;
pub(crate) use crate::run::{EnqueueRun, Pair, Run, statements_per_job, wal_per_job};
use crate::table::ms;
pub(crate) use crate::table::{Table, count, met, rate};

/// Everything one benchmark run measured.
#[derive(Debug)]
pub(crate) struct Report {
    date: String,
    /// The commit measured; a new run of the same commit replaces its section.
    code: String,
    command: String,
    origin: String,
    version: String,
    settings: Vec<(String, String)>,
    machine: Machine,
    statements_unavailable: Option<String>,
    /// `(jobs, rows per statement, time)`.
    pub(crate) enqueue: Option<(u64, u64, Duration)>,
    pub(crate) heartbeat: Vec<Pair>,
    pub(crate) transactional: Vec<Pair>,
    pub(crate) latency: Vec<Latency>,
    /// The latency runs with many producers at once.
    pub(crate) latency_many: Vec<Latency>,
    /// Both modes again on a table with many completed rows.
    pub(crate) big: Vec<Pair>,
    pub(crate) rss: Vec<Rss>,
    /// `(variant, handlers, run)`: the plain path first.
    pub(crate) ops: Vec<(String, usize, Run)>,
    /// `(shape, handlers, run)` of the workflows workload: the plain run first.
    pub(crate) workflows: Vec<(String, usize, Run)>,
    /// The partitioned workload's runs: the plain table first.
    pub(crate) partitioned: Vec<crate::partitioned::PartitionRun>,
    /// The fair workload's runs, each beside the plain table.
    pub(crate) fair: Option<crate::fair::FairReport>,
    /// `(processes, handlers each, run)`.
    pub(crate) processes: Vec<(usize, usize, Run)>,
    /// The heartbeat floor measured before the process runs.
    pub(crate) processes_floor: Option<Run>,
    pub(crate) pooler: Vec<crate::pooler::PoolerRun>,
    /// `(page, p50, p95)` of the dashboard on a big table.
    pub(crate) dashboard: Vec<(String, Duration, Duration)>,
    /// The bloat workload's burn-downs, with and without the claim cursor.
    pub(crate) bloat_burn_downs: Vec<crate::bloat::BurnDown>,
    /// The bloat workload's offered-load runs under a pinned xmin.
    pub(crate) bloat_offered: Vec<crate::bloat::Offered>,
    /// Other libraries beside dbworker and the floor (`--peers`).
    pub(crate) peers: Vec<crate::peers::PeerRuns>,
}

impl Report {
    pub(crate) async fn new(bench: &Bench) -> Result<Report> {
        let (version, settings) = bench.settings().await?;
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut command = "cargo run --release -p dbworker-bench".to_owned();
        if !args.is_empty() {
            command.push_str(" -- ");
            command.push_str(&args.join(" "));
        }
        Ok(Report {
            date: bench.now_utc().await?,
            code: code_version(),
            command,
            origin: bench.origin(),
            version,
            settings,
            machine: Machine::read(),
            statements_unavailable: bench.statements_unavailable().map(str::to_owned),
            enqueue: None,
            heartbeat: Vec::new(),
            transactional: Vec::new(),
            latency: Vec::new(),
            latency_many: Vec::new(),
            ops: Vec::new(),
            workflows: Vec::new(),
            partitioned: Vec::new(),
            fair: None,
            processes: Vec::new(),
            processes_floor: None,
            pooler: Vec::new(),
            dashboard: Vec::new(),
            big: Vec::new(),
            rss: Vec::new(),
            bloat_burn_downs: Vec::new(),
            bloat_offered: Vec::new(),
            peers: Vec::new(),
        })
    }

    /// The set-up, printed before anything runs.
    pub(crate) fn print_header(&self) {
        println!("{} (commit {})", self.date, self.code);
        println!("{}", self.command);
        println!(
            "machine: {} CPUs ({}), {} memory, Linux {}",
            self.machine.cpus, self.machine.cpu_model, self.machine.memory, self.machine.kernel
        );
        println!("server: {}", self.origin);
        println!("{}", self.version);
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("{}", settings.join(" "));
        if let Some(why) = &self.statements_unavailable {
            println!("statements per job: not counted ({why})");
        }
        println!();
    }

    /// Every table, as aligned text.
    pub(crate) fn print_tables(&self) {
        for table in self.tables() {
            println!("{}", table.text());
        }
        for line in self.decay_lines() {
            println!("{line}");
        }
    }

    fn tables(&self) -> Vec<Table> {
        let mut tables = Vec::new();
        if let Some((jobs, batch, took)) = self.enqueue {
            tables.push(Table {
                title: "Enqueue".into(),
                headers: vec!["jobs", "rows per INSERT", "seconds", "jobs/s"],
                rows: vec![vec![
                    count(jobs),
                    count(batch),
                    format!("{:.2}", took.as_secs_f64()),
                    rate(jobs as f64 / took.as_secs_f64().max(1e-9)),
                ]],
            });
        }
        for (title, pairs) in [
            ("Heartbeat handling: burn-down", &self.heartbeat),
            ("Transactional handling: burn-down", &self.transactional),
        ] {
            if !pairs.is_empty() {
                tables.push(pair_table(title, pairs));
            }
        }
        if !self.big.is_empty() {
            let rows = self.big.first().map_or(0, |p| p.completed_rows);
            tables.push(pair_table(
                &format!("With {} completed rows in the table", count(rows)),
                &self.big,
            ));
        }
        if !self.latency.is_empty() {
            tables.push(crate::latency::table(
                &format!(
                    "Insert → handler start (heartbeat handling, {} handlers, one INSERT per statement)",
                    crate::latency::HANDLERS
                ),
                &self.latency,
            ));
        }
        if !self.latency_many.is_empty() {
            tables.push(crate::latency::table(
                &format!(
                    "Insert → handler start from many producers at once (heartbeat handling, {} handlers, one INSERT per statement, commits out of id order)",
                    crate::latency::MANY_HANDLERS
                ),
                &self.latency_many,
            ));
        }
        if !self.rss.is_empty() {
            tables.push(Table {
                title: "Peak RSS of a worker process (VmHWM)".into(),
                headers: vec!["handling", "handlers", "jobs", "VmHWM", "≤ 13 MiB"],
                rows: self
                    .rss
                    .iter()
                    .map(|r| {
                        vec![
                            r.mode.to_string(),
                            r.handlers.to_string(),
                            count(r.jobs),
                            format!("{:.1} MiB", r.mib()),
                            met(r.mib() <= 13.0).to_owned(),
                        ]
                    })
                    .collect(),
            });
        }
        if let Some((_, _, plain)) = self.ops.first() {
            tables.push(Table {
                title: "Operations features, heartbeat handling: cost beside the plain path".into(),
                headers: vec![
                    "variant",
                    "handlers",
                    "jobs",
                    "jobs/s",
                    "÷ plain",
                    "stmts/job",
                ],
                rows: self
                    .ops
                    .iter()
                    .map(|(label, handlers, run)| {
                        vec![
                            label.clone(),
                            handlers.to_string(),
                            count(run.jobs),
                            rate(run.rate()),
                            format!("{:.2}", run.rate() / plain.rate().max(1e-9)),
                            run.statements_per_job(),
                        ]
                    })
                    .collect(),
            });
        }
        tables.extend(crate::workflows::table(&self.workflows));
        tables.extend(crate::partitioned::table(&self.partitioned));
        tables.extend(self.fair.iter().flat_map(crate::fair::tables));
        if !self.bloat_burn_downs.is_empty() {
            tables.push(crate::bloat::burn_down_table(&self.bloat_burn_downs));
        }
        if !self.bloat_offered.is_empty() {
            tables.push(crate::bloat::offered_table(&self.bloat_offered));
        }
        if let (Some((_, _, one)), Some(floor)) = (self.processes.first(), &self.processes_floor) {
            tables.push(Table {
                title: "Worker processes sharing one queue, heartbeat handling".into(),
                headers: vec![
                    "processes",
                    "handlers each",
                    "jobs",
                    "jobs/s",
                    "÷ first row",
                    "÷ floor",
                ],
                rows: self
                    .processes
                    .iter()
                    .map(|(n, handlers, run)| {
                        vec![
                            n.to_string(),
                            handlers.to_string(),
                            count(run.jobs),
                            rate(run.rate()),
                            format!("{:.2}", run.rate() / one.rate().max(1e-9)),
                            format!("{:.2}", run.rate() / floor.rate().max(1e-9)),
                        ]
                    })
                    .collect(),
            });
        }
        tables.extend(crate::pooler::table(&self.pooler));
        if !self.dashboard.is_empty() {
            tables.push(Table {
                title: "Dashboard pages on 1,000,000 completed and 100,000 queued rows (20 requests each)".into(),
                headers: vec!["page", "p50", "p95", "≤ 100 ms"],
                rows: self
                    .dashboard
                    .iter()
                    .map(|(page, p50, p95)| {
                        vec![
                            page.clone(),
                            format!("{:.1} ms", p50.as_secs_f64() * 1000.0),
                            format!("{:.1} ms", p95.as_secs_f64() * 1000.0),
                            met(p95.as_millis() <= 100).to_owned(),
                        ]
                    })
                    .collect(),
            });
        }
        for peer in &self.peers {
            tables.extend(crate::peers::tables(peer));
        }
        let targets = self.targets();
        if !targets.rows.is_empty() {
            tables.push(targets);
        }
        tables
    }

    /// The targets of issue 6, met or not.
    fn targets(&self) -> Table {
        let mut rows = Vec::new();
        if let Some(p) = self.heartbeat.iter().find(|p| p.handlers == 64) {
            rows.push(vec![
                "heartbeat handling, 64 handlers ≥ 0.9 × floor".to_owned(),
                format!("{:.2} × ({} jobs/s)", p.ratio(), rate(p.framework.rate())),
                met(p.ratio() >= 0.9).to_owned(),
            ]);
        }
        for p in &self.transactional {
            rows.push(vec![
                format!(
                    "transactional handling, {} handlers ≥ 0.9 × floor",
                    p.handlers
                ),
                format!("{:.2} ×", p.ratio()),
                met(p.ratio() >= 0.9).to_owned(),
            ]);
        }
        if let Some(l) = self.latency.last() {
            let ok = l.p50 <= Duration::from_micros(1500) && l.p99 <= Duration::from_millis(5);
            rows.push(vec![
                "with NOTIFY: p50 ≤ 1.5 ms, p99 ≤ 5 ms".to_owned(),
                format!("{} / {} ({})", ms(l.p50), ms(l.p99), l.label),
                met(ok).to_owned(),
            ]);
        }
        for r in &self.rss {
            rows.push(vec![
                format!("worker RSS ≤ 13 MiB ({}, {} handlers)", r.mode, r.handlers),
                format!("{:.1} MiB", r.mib()),
                met(r.mib() <= 13.0).to_owned(),
            ]);
        }
        Table {
            title: "Targets (issue 6)".into(),
            headers: vec!["target", "measured", "met"],
            rows,
        }
    }

    /// Jobs/s per second of the runs on the big table (and the partitioned ones).
    fn decay_lines(&self) -> Vec<String> {
        let mut lines = crate::partitioned::series_lines(&self.partitioned);
        for p in &self.big {
            for (who, run) in [("dbworker", &p.framework), ("floor", &p.floor)] {
                lines.push(format!(
                    "{} {} handlers, {who}: jobs/s per second: {}",
                    p.mode,
                    p.handlers,
                    run.series()
                ));
            }
        }
        lines
    }

    /// Records this run: its section first among the runs of
    /// docs/benchmarks-archive.md (replacing the section of an earlier run of
    /// the same commit), its summary between the markers of docs/benchmarks.md,
    /// and the chart redrawn; returns the paths written.
    pub(crate) fn write_docs(&self) -> Result<Vec<String>> {
        crate::docs_merge::write(
            &self.code,
            &self.markdown_section(),
            &self.markdown_summary(),
            crate::chart::render(&self.heartbeat, &self.transactional, &self.date),
        )
    }

    /// `Run of <date>, commit <code>`: the heading of this run's section.
    fn heading(&self) -> String {
        format!("Run of {}, commit {}", self.date, self.code)
    }

    /// The front page's few lines on this run: its heading, linked to its
    /// whole section in the archive, its command (which says what ran) and
    /// its main table.
    fn markdown_summary(&self) -> String {
        let heading = self.heading();
        let mut s = format!(
            "{heading} ([the full section]({}#{})):\n\n```sh\n{}\n```\n\n",
            crate::docs_merge::ARCHIVE,
            crate::docs_merge::anchor(&heading),
            self.command
        );
        if let Some(table) = self.main_table() {
            s.push_str(&table.markdown());
        }
        s
    }

    /// The table a summary shows: the first after the enqueue rate (which
    /// says least about the library), so the heartbeat burn-down of a full
    /// run and the workload's own table of a partial one.
    fn main_table(&self) -> Option<Table> {
        let tables = self.tables();
        let skip = usize::from(self.enqueue.is_some() && tables.len() > 1);
        tables.into_iter().nth(skip)
    }

    fn markdown_section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", crate::docs_merge::run_marker(&self.code));
        let _ = writeln!(s, "## {}\n", self.heading());
        let _ = writeln!(s, "```sh\n{}\n```\n", self.command);
        let _ = writeln!(
            s,
            "- Machine: {} CPUs ({}), {} memory, Linux {}",
            self.machine.cpus, self.machine.cpu_model, self.machine.memory, self.machine.kernel
        );
        let _ = writeln!(
            s,
            "- Server: {}",
            self.origin.split(" (data in").next().unwrap_or("")
        );
        let _ = writeln!(s, "- {}", self.version);
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(k, v)| format!("`{k}={v}`"))
            .collect();
        let _ = writeln!(s, "- Settings: {}", settings.join(", "));
        if let Some(why) = &self.statements_unavailable {
            let _ = writeln!(s, "- Statements per job: not counted ({why})");
        }
        s.push('\n');
        for table in self.tables() {
            s.push_str(&table.markdown());
            s.push('\n');
        }
        let decay = self.decay_lines();
        if !decay.is_empty() {
            s.push_str("Jobs/s in each full second:\n\n");
            for line in decay {
                let _ = writeln!(s, "- {line}");
            }
        }
        s
    }
}

/// The table of framework/floor pairs.
fn pair_table(title: &str, pairs: &[Pair]) -> Table {
    Table {
        title: title.to_owned(),
        headers: vec![
            "handling",
            "handlers",
            "jobs",
            "dbworker jobs/s",
            "pool",
            "floor jobs/s",
            "floor conns",
            "dbworker ÷ floor",
            "stmts/job dbworker",
            "stmts/job floor",
            "WAL/job dbworker",
            "WAL/job floor",
        ],
        rows: pairs
            .iter()
            .map(|p| {
                vec![
                    p.mode.to_string(),
                    p.handlers.to_string(),
                    count(p.framework.jobs),
                    match p.framework.first_and_last() {
                        Some((a, b)) if p.completed_rows > 0 => format!(
                            "{} (first {} → last {})",
                            rate(p.framework.rate()),
                            rate(a),
                            rate(b)
                        ),
                        _ => rate(p.framework.rate()),
                    },
                    p.framework.connections.to_string(),
                    rate(p.floor.rate()),
                    p.floor.connections.to_string(),
                    format!("{:.2}", p.ratio()),
                    p.framework.statements_per_job(),
                    p.floor.statements_per_job(),
                    p.framework.wal_per_job(),
                    p.floor.wal_per_job(),
                ]
            })
            .collect(),
    }
}
