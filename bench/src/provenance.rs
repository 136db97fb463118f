//! What a run records about itself: the introduction of a new
//! docs/benchmarks-archive.md and the code version it measured.

/// The header of the archive when there is none yet: what the runs below it
/// are and how to read them. An existing archive keeps its own header (the
/// benchmark only adds runs under it), so a change here reaches only a new
/// archive.
pub(crate) fn intro() -> String {
    format!(
        "# Benchmark runs: the archive\n\n\
         Every run the benchmark (`bench/`) recorded with\n\n\
         ```sh\n\
         cargo run --release -p dbworker-bench -- --jobs 100000 --write-docs\n\
         ```\n\n\
         newest first. [benchmarks.md](benchmarks.md) shows the current figures and a summary \
         of the latest run.\n\n\
         ## How to read this\n\n\
         - Only ratios within one run count. Absolute figures on a shared 2-core machine drift \
         by 2× between minutes, so each dbworker run is followed at once by its raw-SQL floor, and \
         the ratio compares the two.\n\
         - **Heartbeat floor**: 16 connections, each claiming 100 rows per statement \
         (`UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING id`) and \
         completing them in one `UPDATE … WHERE id = ANY($1)`. **Transactional floor**: a batch \
         claim into the free slots, then one transaction per job (BEGIN; `FOR KEY SHARE`; UPDATE; \
         COMMIT) with as many jobs at once as the dbworker run has handlers.\n\
         - Jobs are no-ops; jobs/s runs from the start to the last recorded completion. Each run \
         gets a freshly created, vacuumed and analyzed table, and starts right after a \
         `CHECKPOINT`.\n\
         - Statements per job come from `pg_stat_statements` on the bench database: all / without \
         utility statements (BEGIN, COMMIT, ...). WAL per job is how far `pg_current_wal_lsn()` \
         moved during the run, divided by its jobs (the server's other writes meanwhile, \
         autovacuum and checkpoints, included). Beside a peer, both count the enqueue too, and \
         the peer's its schema set-up.\n\
         - **Operations features** (runs from the `ops` workload on): the plain heartbeat \
         burn-down, then the same with a `KindRegistry` that restricts the claim to its kind, then \
         with the queue under a global concurrency limit that is never reached (claims in four \
         claim lanes while every limited queue has room for all of them), then under a rate limit \
         far above the throughput (the token bucket read and spent by every claim); the ratio is \
         to the plain run of the same run.\n\
         - **Latency** (the `latency` workload): insert → handler start, the clock read just \
         before each one-row INSERT is sent and on the handler's first line. At `--latency-rate` \
         from one connection, NOTIFY off (polling every 10 ms) and on; then `--producers-rate` in \
         all from `--producers` connections at once (NOTIFY on, 64 handlers), whose commits land \
         out of id order, so some jobs commit behind the claim cursor: once as is, once while a \
         REPEATABLE READ snapshot holds the xmin.\n\
         {}{}{}\
         - **Bloat** (the `bloat` workload): a burn-down of `--bloat-jobs` queued rows (jobs/s per \
         5 s window), then `--bloat-rate` jobs/s offered for `--bloat-seconds` while a REPEATABLE \
         READ transaction pins the xmin for the middle `--bloat-pin-seconds` (completions per 10 s \
         window, pickup before and during the pin, dead tuples, WAL bytes per job); each with the \
         claim cursor, without it, and as the raw-SQL floor (which polls every 10 ms when idle).\n\
         - **Worker processes** (the `processes` workload): N separate worker processes of \
         `--process-handlers` handlers each burn down one queue; jobs/s from the first claim to the \
         last completion (database clock), beside the heartbeat floor measured just before.\n\
         - **Through a transaction pooler** (the `pooler` workload): for each shape, \
         `--pooler-processes` worker processes of `--pooler-handlers` handlers each (8 × 8, then \
         2 × 32: the same 64 handlers) burn down one queue, in heartbeat \
         and then in transactional handling, once on direct connections and once through PgBouncer \
         in `pool_mode = transaction` with `default_pool_size = 20`, started by the benchmark in \
         front of the same server (`Pooler::Transaction`, no listen URL: every statement unnamed and \
         in a transaction, the workers poll); jobs/s from the first claim to the last completion \
         (database clock), beside the floor of the same mode measured right after (transactional: \
         at all the processes' handlers at once). Connections are the direct pools' sizes summed, \
         or PgBouncer's server connections. Skipped, saying why, without pgbouncer.\n\
         - **Dashboard** (the `dashboard` workload): each page requested 20 times through the \
         router (after two warm-up requests) on a table of `--completed-rows` completed and 100,000 \
         queued rows; the overview's counts follow the partial indexes, never the whole table.\n\
         - **Peers** (on by default beside the `heartbeat` and `latency` workloads, each beside \
         its own; `--no-peers` leaves them out, and a peer that does not build, e.g. offline, is \
         skipped saying why): graphile_worker (Rust) from crates.io, built \
         by the benchmark from `bench-peers/graphile/` (a Cargo project outside the workspace, so \
         `cargo test` and CI never compile it) and run as a process at each of `--peer-handlers` \
         (24 and 100) right after dbworker (heartbeat handling, defaults, LISTEN on) and the \
         heartbeat floor, then for pickup latency beside dbworker's NOTIFY-on run at the same \
         rate. The peer migrates its own schema, enqueues its jobs in batches before its clock \
         starts, and is configured from its own documentation for many small jobs, tuned to the \
         fastest variant we found (a local queue of 1,000 jobs × 4 queues, completion batching; \
         the table titles state version and configuration, `bench-peers/graphile/src/main.rs` the \
         variants tried). Only the ratios of one run count: other builds \
         share the machine.\n\n",
        crate::workflows::INTRO,
        crate::partitioned::INTRO,
        crate::fair::INTRO
    )
}

/// `git rev-parse --short HEAD`, with `+dirty` for uncommitted changes to
/// tracked files outside docs/ (which the benchmark itself writes); `unknown`
/// outside a git checkout.
pub(crate) fn code_version() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(crate::workspace_root())
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&[
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!docs",
            ])
            .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}+dirty") } else { head }
        }
        None => "unknown".to_owned(),
    }
}
