//! The benchmark's command line: the workloads and their knobs.

use clap::{Args, ValueEnum};

use crate::{bloat, fair, long, peers};

/// The workloads, selectable with `--workloads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Workload {
    /// Enqueue rate.
    Enqueue,
    /// Heartbeat handling burn-down and its floor.
    Heartbeat,
    /// Transactional handling burn-down and its floor.
    Transactional,
    /// Insert → handler start latency.
    Latency,
    /// Both burn-downs with completed rows already in the table.
    Big,
    /// Peak RSS of a worker process.
    Rss,
    /// The cost of kinds dispatch and of a global concurrency limit, beside
    /// the plain heartbeat path.
    Ops,
    /// Several worker processes sharing one queue.
    Processes,
    /// Worker processes through PgBouncer in transaction mode beside direct
    /// connections, both handling modes.
    Pooler,
    /// The dashboard's pages on a table of 1,000,000 completed and 100,000
    /// queued rows.
    Dashboard,
    /// Dependency release: fan-ins, chains and diamonds beside the plain
    /// heartbeat burn-down.
    Workflows,
    /// A table partitioned by day: the claim rate with the jobs in ten
    /// partitions and while the purger drops old partitions, beside the
    /// plain table.
    Partitioned,
    /// Dead index entries vacuum cannot remove: a long burn-down, and an
    /// offered load while another transaction pins the xmin; with and without
    /// the claim cursor.
    Bloat,
    /// Fair claims (`dbworker migration --fair`) beside the plain table:
    /// burn-downs, enqueues and the claim on a backlog. Not in the default set.
    Fair,
    /// Long jobs' features beside the plain path, in interleaved rounds:
    /// trace capture on enqueue, signal → resume latency, checkpoint cost.
    /// Not in the default set.
    Long,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Jobs per heartbeat burn-down (and enqueue measurement).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) jobs: u64,
    /// Jobs per transactional burn-down (commit-bound, so fewer). Default: jobs / 5.
    #[arg(long)]
    pub(crate) tx_jobs: Option<u64>,
    /// Handler counts for heartbeat handling.
    #[arg(long, value_delimiter = ',', default_value = "8,16,24,64,100")]
    pub(crate) handlers: Vec<usize>,
    /// Handler counts for transactional handling.
    #[arg(long, value_delimiter = ',', default_value = "8,16,24,64")]
    pub(crate) tx_handlers: Vec<usize>,
    /// Connections of the heartbeat floor.
    #[arg(long, default_value_t = 16)]
    pub(crate) floor_connections: usize,
    /// Rows per claim (and per completion) statement of the floors.
    #[arg(long, default_value_t = 100)]
    pub(crate) floor_batch: usize,
    /// Rows per enqueue statement.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) enqueue_batch: u64,
    /// Completed rows already in the table for the `big` workload (which runs
    /// heartbeat handling at the largest handler count up to 64, and
    /// transactional handling at 24 or the first count given).
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) completed_rows: u64,
    /// Jobs of each latency run.
    #[arg(long, default_value_t = 300)]
    pub(crate) latency_jobs: u64,
    /// Inserts per second of the latency runs.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) latency_rate: f64,
    /// Concurrent inserting connections of the latency workload's
    /// many-producers runs (0: none).
    #[arg(long, default_value_t = 8)]
    pub(crate) producers: usize,
    /// Inserts per second, in all, of the many-producers runs.
    #[arg(long, default_value_t = 1_200.0)]
    pub(crate) producers_rate: f64,
    /// Jobs of each many-producers run.
    #[arg(long, default_value_t = 12_000)]
    pub(crate) producers_jobs: u64,
    /// Handlers of the worker whose RSS is measured.
    #[arg(long, default_value_t = 64)]
    pub(crate) rss_handlers: usize,
    /// Worker process counts of the `processes` workload.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) processes: Vec<usize>,
    /// Handlers of each worker process in the `processes` workload.
    #[arg(long, default_value_t = 32)]
    pub(crate) process_handlers: usize,
    /// Worker processes of the `pooler` workload's shapes, paired in order
    /// with `--pooler-handlers`: the same 64 handlers as many small
    /// processes and as few large ones (whose claims and marks carry more
    /// jobs per statement, what a pooler that prepares nothing rewards).
    #[arg(long, value_delimiter = ',', default_value = "8,2")]
    pub(crate) pooler_processes: Vec<usize>,
    /// Handlers of each worker process, one per `--pooler-processes` entry.
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pub(crate) pooler_handlers: Vec<usize>,
    /// Queued rows of the bloat workload's burn-down.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) bloat_jobs: u64,
    /// Jobs offered per second in the bloat workload's pinned-xmin run.
    #[arg(long, default_value_t = 1_500.0)]
    pub(crate) bloat_rate: f64,
    /// Length of the pinned-xmin run, in seconds.
    #[arg(long, default_value_t = 420)]
    pub(crate) bloat_seconds: u64,
    /// How long the xmin stays pinned (in the middle of the run), in seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) bloat_pin_seconds: u64,
    /// Who claims in the bloat workload's runs (a long pin for the cursor
    /// alone: `--bloat-claims cursor --bloat-jobs 0`).
    #[arg(long, value_delimiter = ',', default_value = "cursor,no-cursor,floor")]
    pub(crate) bloat_claims: Vec<bloat::Claims>,
    /// Finished rows in the old partitions the `partitioned` workload's
    /// purger drops (five partitions).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) partition_old_rows: u64,
    #[command(flatten)]
    pub(crate) fair: fair::FairArgs,
    #[command(flatten)]
    pub(crate) long: long::LongArgs,
    /// Which workloads to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "enqueue,heartbeat,transactional,latency,big,rss,ops,workflows,partitioned,processes,pooler,dashboard,bloat"
    )]
    pub(crate) workloads: Vec<Workload>,
    /// Peers to run beside dbworker and the floor (each built on demand from
    /// bench-peers/, outside the workspace, needing crates.io the first time):
    /// throughput at `--peer-handlers` and pickup latency. A peer that does not
    /// build is skipped, saying why.
    #[arg(long, value_delimiter = ',', default_value = "graphile")]
    pub(crate) peers: Vec<peers::Peer>,
    /// Run no peer.
    #[arg(long)]
    pub(crate) no_peers: bool,
    /// Handler counts (the peer's concurrency) of the peers' burn-downs.
    #[arg(long, value_delimiter = ',', default_value = "24,100")]
    pub(crate) peer_handlers: Vec<usize>,
    /// Record the run: its section first in docs/benchmarks-archive.md, its
    /// summary between the latest-run markers of docs/benchmarks.md (nothing
    /// else there changes), and redraw docs/bench-jobs-per-handler.svg.
    #[arg(long)]
    pub(crate) write_docs: bool,
}

impl BenchArgs {
    pub(crate) fn tx_jobs(&self) -> u64 {
        self.tx_jobs.unwrap_or(self.jobs / 5).max(1)
    }

    pub(crate) fn runs(&self, w: Workload) -> bool {
        self.workloads.contains(&w)
    }
}
