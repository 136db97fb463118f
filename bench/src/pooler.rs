//! The cost of a transaction pooler: worker processes sharing one queue (for
//! each shape of `--pooler-processes` × `--pooler-handlers`), in heartbeat
//! and in transactional handling, once on direct connections, once on direct
//! connections as few as PgBouncer's (as many processes as fit in its 20
//! server connections), in heartbeat handling once more with the same
//! processes sharing 20 direct connections (when each can have the fewest it
//! needs), and once through PgBouncer in transaction mode with a pool of 20
//! server connections (`Pooler::Transaction`: every statement unnamed and in
//! a transaction), each beside the raw-SQL floor of its mode. PgBouncer is
//! started by the benchmark (as by the tests); without it installed the
//! workload is skipped, saying why.

use crate::Result;
use crate::db::{Bench, Mode};
use crate::floor;
use crate::processes::{self, Spawn};
use crate::report::{Run, Table};
use crate::table::{count, rate};
use dbworker_testkit::pgbouncer as bouncer;

/// PgBouncer's server connections (`default_pool_size`).
pub(crate) const SERVER_CONNECTIONS: u32 = 20;

/// The fewest connections a heartbeat worker process's pool may have: one for
/// claims, one for heartbeats, one for grouped marks (a worker refuses a
/// smaller pool at start).
const FEWEST_PER_PROCESS: u32 = dbworker::RESERVED_CONNECTIONS + 1;

/// One mode's runs: direct, through PgBouncer, and the floor.
#[derive(Debug)]
pub(crate) struct PoolerRun {
    pub(crate) mode: Mode,
    pub(crate) processes: usize,
    pub(crate) handlers: usize,
    pub(crate) direct: Run,
    /// Direct, on no more connections than PgBouncer's server pool: fewer
    /// processes of the same handlers.
    pub(crate) direct_same: Run,
    pub(crate) same_processes: usize,
    /// Direct, the same processes and handlers, their pools sharing out as
    /// many connections as PgBouncer's server pool: what differs from the
    /// pooled run is PgBouncer alone.
    /// Heartbeat handling only, and only when the processes fit (see `run`).
    pub(crate) direct_shared: Option<Run>,
    pub(crate) pooled: Run,
    pub(crate) floor: Run,
}

/// The knobs of the workload.
pub(crate) struct Sizes {
    pub(crate) processes: usize,
    pub(crate) handlers: usize,
    /// Jobs of the heartbeat runs, and of the transactional ones.
    pub(crate) jobs: u64,
    pub(crate) tx_jobs: u64,
    pub(crate) batch: u64,
    /// The heartbeat floor's connections and rows per statement.
    pub(crate) floor_connections: usize,
    pub(crate) floor_batch: usize,
}

/// Runs both modes, direct and through PgBouncer; `Ok(None)`, with the
/// reason printed, when PgBouncer is not installed.
pub(crate) async fn run(bench: &Bench, sizes: &Sizes) -> Result<Option<Vec<PoolerRun>>> {
    let binary = match bouncer::find() {
        Ok(binary) => binary,
        Err(reason) => {
            crate::progress(format_args!("pooler: skipped: {reason}"));
            return Ok(None);
        }
    };
    let url = bench.url().to_owned();
    let pgbouncer = tokio::task::spawn_blocking(move || {
        bouncer::Bouncer::start(&binary, &url, SERVER_CONNECTIONS, true)
    })
    .await?;
    let mut runs = Vec::new();
    for (mode, jobs) in [
        (Mode::Heartbeat, sizes.jobs),
        (Mode::Transactional, sizes.tx_jobs),
    ] {
        let burn = async |url: &str, pooler: bool, processes: usize, connections| {
            let spawn = Spawn {
                url,
                mode,
                pooler,
                connections,
            };
            processes::run_as(bench, &spawn, processes, sizes.handlers, jobs, sizes.batch).await
        };
        let direct = burn(bench.url(), false, sizes.processes, None).await?;
        let per_process = crate::framework::pool_size(mode, sizes.handlers);
        let same_processes = usize::try_from(SERVER_CONNECTIONS / per_process.max(1))
            .unwrap_or(1)
            .clamp(1, sizes.processes);
        let direct_same = burn(bench.url(), false, same_processes, None).await?;
        // Transactional handling refuses a pool smaller than its handlers
        // need (each running job holds a connection): only PgBouncer, which
        // queues the clients, shares so few among so many handlers.
        // Nor can more processes share them than have their fewest each.
        let fit = u32::try_from(sizes.processes)
            .is_ok_and(|n| n.saturating_mul(FEWEST_PER_PROCESS) <= SERVER_CONNECTIONS);
        let direct_shared = match mode {
            Mode::Heartbeat if fit => {
                let connections = Some(SERVER_CONNECTIONS);
                Some(burn(bench.url(), false, sizes.processes, connections).await?)
            }
            Mode::Heartbeat => {
                crate::progress(format_args!(
                    "pooler: {} processes cannot share {SERVER_CONNECTIONS} direct connections ({FEWEST_PER_PROCESS} each at least): no such run",
                    sizes.processes
                ));
                None
            }
            Mode::Transactional => None,
        };
        let mut pooled = burn(&pgbouncer.url(), true, sizes.processes, None).await?;
        pooled.connections = SERVER_CONNECTIONS;
        bench.prepare(0, jobs, sizes.batch).await?;
        let floor = match mode {
            Mode::Heartbeat => {
                floor::heartbeat(bench, sizes.floor_connections, sizes.floor_batch, jobs).await?
            }
            Mode::Transactional => {
                let handlers = sizes.processes * sizes.handlers;
                floor::transactional(bench, handlers, sizes.floor_batch, jobs).await?
            }
        };
        crate::progress(format_args!(
            "pooler: {mode}, {} × {} handlers: direct {:.0} jobs/s ({same_processes} × {}: {:.0}; on {SERVER_CONNECTIONS} connections in all: {:?}), PgBouncer {:.0} jobs/s, floor {:.0} jobs/s",
            sizes.processes,
            sizes.handlers,
            direct.rate(),
            sizes.handlers,
            direct_same.rate(),
            direct_shared.as_ref().map(|r| r.rate().round()),
            pooled.rate(),
            floor.rate()
        ));
        runs.push(PoolerRun {
            mode,
            processes: sizes.processes,
            handlers: sizes.handlers,
            direct,
            direct_same,
            same_processes,
            direct_shared,
            pooled,
            floor,
        });
    }
    Ok(Some(runs))
}

/// The workload's table: each mode direct and through PgBouncer.
pub(crate) fn table(runs: &[PoolerRun]) -> Option<Table> {
    if runs.is_empty() {
        return None;
    }
    let rows = runs
        .iter()
        .flat_map(|r| {
            [
                ("direct", Some(&r.direct), r.processes),
                (
                    "direct, as few connections as PgBouncer's",
                    Some(&r.direct_same),
                    r.same_processes,
                ),
                (
                    "direct, pools sharing PgBouncer's connections",
                    r.direct_shared.as_ref(),
                    r.processes,
                ),
                ("PgBouncer, transaction mode", Some(&r.pooled), r.processes),
            ]
            .into_iter()
            .filter_map(|(how, run, processes)| Some((how, run?, processes)))
            .map(|(how, run, processes)| {
                let shared = r.direct_shared.as_ref().map(Run::rate);
                vec![
                    r.mode.to_string(),
                    how.to_owned(),
                    format!("{processes} × {}", r.handlers),
                    run.connections.to_string(),
                    count(run.jobs),
                    rate(run.rate()),
                    format!("{:.2}", run.rate() / r.direct.rate().max(1e-9)),
                    format!("{:.2}", run.rate() / r.direct_same.rate().max(1e-9)),
                    shared.map_or("—".into(), |s| format!("{:.2}", run.rate() / s.max(1e-9))),
                    format!("{:.2}", run.rate() / r.floor.rate().max(1e-9)),
                ]
            })
            .collect::<Vec<_>>()
        })
        .collect();
    Some(Table {
        title: format!(
            "Through a transaction pooler (PgBouncer, pool of {SERVER_CONNECTIONS}) beside direct connections"
        ),
        headers: vec![
            "handling",
            "connections via",
            "processes × handlers",
            "connections (at most)",
            "jobs",
            "jobs/s",
            "÷ direct",
            "÷ direct, fewer processes",
            "÷ direct, same processes and server conns",
            "÷ floor",
        ],
        rows,
    })
}
