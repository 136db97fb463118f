//! The workload's tables: every figure of the fair table beside the plain
//! table's, and their ratio.

use super::FairReport;
use super::claim::{CLAIM_SIZE, ClaimRun};
use super::enqueue::IN_USE;
use super::profile::Split;
use crate::db::Statements;
use crate::report::{Run, Table, count, rate, statements_per_job, wal_per_job};
use crate::table::ms;

/// `fair ÷ plain`, two decimals (three below 0.1, where two would say 0.00).
fn ratio(fair: f64, plain: f64) -> String {
    let r = fair / plain.max(1e-9);
    if r < 0.1 {
        format!("{r:.3}")
    } else {
        format!("{r:.2}")
    }
}

/// Fair WAL bytes per job ÷ plain, when both were counted.
fn wal_ratio(fair: &Run, plain: &Run) -> String {
    match (fair.statements, plain.statements) {
        (Some(f), Some(p)) => ratio(
            f.wal_bytes as f64 / fair.jobs.max(1) as f64,
            p.wal_bytes as f64 / plain.jobs.max(1) as f64,
        ),
        _ => "n/a".to_owned(),
    }
}

/// Statements per 1,000 jobs, all / non-utility: a heartbeat burn-down
/// claims and completes in batches, so per job they round to 0.00.
fn per_thousand(run: &Run) -> String {
    match run.statements {
        Some(s) => {
            let k = run.jobs.max(1) as f64 / 1000.0;
            format!("{:.1} / {:.1}", s.all as f64 / k, s.non_utility as f64 / k)
        }
        None => "n/a".to_owned(),
    }
}

/// The tables of one run of the workload.
pub(crate) fn tables(r: &FairReport) -> Vec<Table> {
    let mut tables = Vec::new();
    if !r.burn_downs.is_empty() {
        tables.push(burn_downs(r));
    }
    if !r.enqueues.is_empty() {
        tables.push(enqueues(r));
    }
    if let [plain, fair] = r.claims.as_slice() {
        tables.push(claims(plain, fair));
        tables.push(plans(&r.claims));
    }
    tables.push(profile(r));
    tables
}

fn burn_downs(r: &FairReport) -> Table {
    Table {
        title: format!(
            "Fair claims, heartbeat handling: burn-down beside the plain table (fair: jobs over {} keys)",
            count(r.keys)
        ),
        headers: vec![
            "handlers",
            "jobs",
            "plain jobs/s",
            "fair jobs/s",
            "fair ÷ plain",
            "plain, cursor off jobs/s",
            "fair ÷ plain, cursor off",
            "stmts per 1,000 jobs plain",
            "stmts per 1,000 jobs fair",
            "WAL/job plain",
            "WAL/job fair",
            "WAL fair ÷ plain",
        ],
        rows: r
            .burn_downs
            .iter()
            .map(|b| {
                vec![
                    b.handlers.to_string(),
                    count(b.fair.jobs),
                    rate(b.plain.rate()),
                    rate(b.fair.rate()),
                    ratio(b.fair.rate(), b.plain.rate()),
                    rate(b.no_cursor.rate()),
                    ratio(b.fair.rate(), b.no_cursor.rate()),
                    per_thousand(&b.plain),
                    per_thousand(&b.fair),
                    b.plain.wal_per_job(),
                    b.fair.wal_per_job(),
                    wal_ratio(&b.fair, &b.plain),
                ]
            })
            .collect(),
    }
}

fn enqueues(r: &FairReport) -> Table {
    let wal = |s: Option<Statements>, jobs| wal_per_job(s, jobs);
    Table {
        title: format!(
            "Fair claims: enqueue from one connection, tagged into the fair table ({} keys) beside untagged into the plain table; each table holds {} waiting jobs first (analyzed), but the new one",
            count(r.keys),
            count(IN_USE)
        ),
        headers: vec![
            "path",
            "jobs",
            "plain jobs/s",
            "fair jobs/s",
            "fair ÷ plain",
            "WAL/job plain",
            "WAL/job fair",
        ],
        rows: r
            .enqueues
            .iter()
            .map(|e| {
                vec![
                    e.shape.label().to_owned(),
                    count(e.fair.jobs),
                    rate(e.plain.rate()),
                    rate(e.fair.rate()),
                    ratio(e.fair.rate(), e.plain.rate()),
                    wal(e.plain.statements, e.plain.jobs),
                    wal(e.fair.statements, e.fair.jobs),
                ]
            })
            .collect(),
    }
}

fn claims(plain: &ClaimRun, fair: &ClaimRun) -> Table {
    let row = |c: &ClaimRun| {
        let secs = |d: std::time::Duration| d.as_secs_f64();
        vec![
            c.table_name().to_owned(),
            if c.fair {
                format!("{} rows over {} keys", count(c.backlog), count(c.keys))
            } else {
                format!("{} rows", count(c.backlog))
            },
            c.claims.to_string(),
            ms(c.p50),
            ms(c.p99),
            ms(c.max),
            c.server.map_or("n/a".into(), |(mean, max)| {
                format!("{} / {}", ms(mean), ms(max))
            }),
            statements_per_job(c.statements, u64::try_from(c.claims).unwrap_or(1)),
            if c.fair {
                format!(
                    "p50 {}, p99 {}, server mean {}",
                    ratio(secs(fair.p50), secs(plain.p50)),
                    ratio(secs(fair.p99), secs(plain.p99)),
                    match (fair.server, plain.server) {
                        (Some((f, _)), Some((p, _))) => ratio(secs(f), secs(p)),
                        _ => "n/a".into(),
                    }
                )
            } else {
                "—".to_owned()
            },
        ]
    };
    Table {
        title: format!(
            "Fair claims: a claim of {CLAIM_SIZE} (Store::dequeue, one at a time, one connection) on a backlog"
        ),
        headers: vec![
            "table",
            "waiting",
            "claims",
            "p50",
            "p99",
            "max",
            "server exec mean / max",
            "stmts/claim",
            "fair ÷ plain",
        ],
        rows: vec![row(plain), row(fair)],
    }
}

fn plans(claims: &[ClaimRun]) -> Table {
    Table {
        title: "Fair claims: the claim's plan (EXPLAIN of the store's own statement, read from pg_stat_activity; 6th execution of the prepared statement, with ANALYZE, rolled back)".into(),
        headers: vec![
            "table",
            "plan run",
            "waiting rows found by",
            "planning / execution",
            "plan",
            "the other plan's candidates",
        ],
        rows: claims
            .iter()
            .map(|c| match &c.plans {
                Ok(p) => vec![
                    c.table_name().to_owned(),
                    p.chosen.to_owned(),
                    p.ran.candidates(),
                    format!("{} / {}", ms(p.times.0), ms(p.times.1)),
                    format!("`{}`", p.ran.render()),
                    p.other.candidates(),
                ],
                Err(why) => vec![
                    c.table_name().to_owned(),
                    format!("n/a: {why}"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ],
            })
            .collect(),
    }
}

fn profile(r: &FairReport) -> Table {
    let title = format!(
        "Fair claims: where a tagged COPY's server time goes, per row (one COPY of 10,000; fair table in use: {} jobs waiting, analyzed; pg_stat_statements.track = all and track_functions = pl add time of their own)",
        count(IN_USE)
    );
    let headers = vec![
        "part",
        "in use: µs per row",
        "in use: share",
        "new, empty table: µs per row",
        "new: share",
    ];
    let p = match &r.profile {
        Ok(p) => p,
        Err(why) => {
            let mut row = vec![format!("not measured: {why}")];
            row.resize(headers.len(), String::new());
            return Table {
                title,
                headers,
                rows: vec![row],
            };
        }
    };
    let cells = |us: Option<f64>, of: &Split| match us {
        Some(us) => [
            format!("{us:.1}"),
            format!("{:.0} %", 100.0 * us / of.copy_us.max(1e-9)),
        ],
        None => [String::new(), String::new()],
    };
    let row = |part: String, a: Option<f64>, b: Option<f64>| {
        let mut row = vec![part];
        row.extend(cells(a, &p.in_use));
        row.extend(cells(b, &p.new_table));
        row
    };
    let statement = |s: &Split, what: &str| {
        s.statements
            .iter()
            .find(|(w, _, _)| *w == what)
            .map(|(_, _, us)| *us)
    };
    let mut whats: Vec<&str> = p.in_use.statements.iter().map(|(w, _, _)| *w).collect();
    for (w, _, _) in &p.new_table.statements {
        if !whats.contains(w) {
            whats.push(w);
        }
    }
    let rest = |s: &Split| s.copy_us - s.function.1 - p.plain_us;
    let mut rows = vec![
        row(
            "COPY into the plain table in use".to_owned(),
            Some(p.plain_us),
            None,
        ),
        row(
            format!(
                "COPY into the fair table ({} trigger calls)",
                count(p.in_use.function.0)
            ),
            Some(p.in_use.copy_us),
            Some(p.new_table.copy_us),
        ),
        row(
            "… the tagging trigger, in all".to_owned(),
            Some(p.in_use.function.1),
            Some(p.new_table.function.1),
        ),
    ];
    for what in whats {
        rows.push(row(
            format!("… … {what}"),
            statement(&p.in_use, what),
            statement(&p.new_table, what),
        ));
    }
    rows.push(row(
        "… … the rest of the function (PL/pgSQL around the statements: plan look-ups, executor start and end, expressions)".to_owned(),
        Some(p.in_use.function.2),
        Some(p.new_table.function.2),
    ));
    rows.push(row(
        "… the rest beyond the plain COPY (row-at-a-time insert, two more index entries, wider rows)".to_owned(),
        Some(rest(&p.in_use)),
        Some(rest(&p.new_table)),
    ));
    Table {
        title,
        headers,
        rows,
    }
}
