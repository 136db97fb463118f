//! Checkpoint cost: one job that writes `chunks × items` rows into a table
//! of its own, a chunk (one INSERT … SELECT of `items` rows) at a time,
//! and saves a checkpoint after each chunk (`DbJob::save_checkpoint`, on a
//! table with `dbworker migration --progress`), beside the same job on the
//! same table without the checkpoints; in each handling mode. In
//! transactional handling the chunks go into the job's transaction, which
//! each checkpoint commits and opens again, so without checkpoints the job
//! commits once; in heartbeat handling each chunk commits on the pool, and a
//! checkpoint is one write more. The job's time runs from its handler's
//! first line to its recorded outcome (its last commit included); each
//! `save_checkpoint` call is also timed on its own, and the statements and
//! WAL of the whole run are counted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbworker::ddl::{OptionalColumns, optional_columns_sql};
use dbworker::{DbJob, DbStore, JobTable, new_worker};
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};
use workerutil::{Handler, HandlerError, JobContext, Outcome};

use super::{plain_first, say};
use crate::db::{Bench, Mode, Statements, TABLE};
use crate::framework::{self, BenchJob};
use crate::latency::lock;
use crate::{RUN_TIMEOUT, Result};

/// The job's own table: the rows it "imports".
const ITEMS: &str = "bench_long_items";

/// The checkpointed job's size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) chunks: u64,
    pub(crate) items: u64,
}

/// One job's run.
#[derive(Debug)]
pub(crate) struct CheckpointRun {
    /// Handler start → outcome recorded.
    pub(crate) elapsed: Duration,
    /// Each `save_checkpoint` call (none without checkpoints).
    pub(crate) saves: Vec<Duration>,
    pub(crate) statements: Option<Statements>,
}

/// One round: the job without checkpoints and with them, in the order it says.
#[derive(Debug)]
pub(crate) struct CheckpointRound {
    pub(crate) plain_first: bool,
    pub(crate) plain: CheckpointRun,
    pub(crate) checkpointed: CheckpointRun,
}

/// The rounds of one handling mode.
#[derive(Debug)]
pub(crate) struct CheckpointRounds {
    pub(crate) mode: Mode,
    pub(crate) sizes: Sizes,
    pub(crate) rounds: Vec<CheckpointRound>,
}

impl CheckpointRounds {
    /// Items per second of `run`.
    pub(crate) fn rate(&self, run: &CheckpointRun) -> f64 {
        (self.sizes.chunks * self.sizes.items) as f64 / run.elapsed.as_secs_f64().max(1e-9)
    }

    /// The job's extra time per checkpoint in `round`.
    pub(crate) fn per_checkpoint(&self, round: &CheckpointRound) -> f64 {
        (round.checkpointed.elapsed.as_secs_f64() - round.plain.elapsed.as_secs_f64())
            / self.sizes.chunks as f64
    }

    /// `(all, non-utility, WAL bytes)` more per checkpoint in `round`, when counted.
    pub(crate) fn statements_per_checkpoint(
        &self,
        round: &CheckpointRound,
    ) -> Option<(f64, f64, f64)> {
        let (with, without) = (round.checkpointed.statements?, round.plain.statements?);
        let per = |a: u64, b: u64| (a as f64 - b as f64) / self.sizes.chunks as f64;
        Some((
            per(with.all, without.all),
            per(with.non_utility, without.non_utility),
            per(with.wal_bytes, without.wal_bytes),
        ))
    }
}

/// `rounds` interleaved rounds of the job in `mode`, without and with checkpoints.
pub(crate) async fn rounds(
    bench: &Bench,
    mode: Mode,
    sizes: Sizes,
    rounds: usize,
) -> Result<CheckpointRounds> {
    let mut out = CheckpointRounds {
        mode,
        sizes,
        rounds: Vec::with_capacity(rounds),
    };
    for r in 0..rounds {
        let first = plain_first(r);
        let a = run(bench, mode, sizes, !first).await?;
        let b = run(bench, mode, sizes, first).await?;
        let (plain, checkpointed) = if first { (a, b) } else { (b, a) };
        let round = CheckpointRound {
            plain_first: first,
            plain,
            checkpointed,
        };
        say(format_args!(
            "checkpoints, {mode}, round {}: {:.0} items/s without, {:.0} with ({:.3}); {:.2} ms more per checkpoint",
            r + 1,
            out.rate(&round.plain),
            out.rate(&round.checkpointed),
            out.rate(&round.checkpointed) / out.rate(&round.plain).max(1e-9),
            out.per_checkpoint(&round) * 1000.0
        ));
        out.rounds.push(round);
    }
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {ITEMS}")))
        .execute(bench.admin())
        .await?;
    Ok(out)
}

/// Writes the chunks, checkpointing after each when asked; records its times.
struct Chunks {
    pool: PgPool,
    sizes: Sizes,
    checkpoints: bool,
    started: Mutex<Option<Instant>>,
    finished: Mutex<Option<Instant>>,
    saves: Mutex<Vec<Duration>>,
}

impl Handler<DbStore<BenchJob>> for Chunks {
    async fn handle(
        &self,
        job: &mut DbJob<BenchJob>,
        ctx: &JobContext<DbStore<BenchJob>>,
    ) -> std::result::Result<(), HandlerError> {
        *lock(&self.started) = Some(Instant::now());
        let id = workerutil::Record::id(job.record());
        let Sizes { chunks, items } = self.sizes;
        let insert = format!(
            "INSERT INTO {ITEMS} (job_id, item) SELECT $1, g FROM generate_series($2::bigint, $3::bigint) AS g"
        );
        for chunk in 0..chunks {
            let (from, to) = (chunk * items, (chunk + 1) * items - 1);
            let bounds = (i64::try_from(from), i64::try_from(to));
            let (Ok(from), Ok(to)) = bounds else {
                return Err(HandlerError::non_retryable(std::io::Error::other(
                    "items out of range",
                )));
            };
            let query = sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(id)
                .bind(from)
                .bind(to);
            match job.tx() {
                Some(tx) => query.execute(tx).await,
                None => query.execute(&self.pool).await,
            }
            .map_err(HandlerError::non_retryable)?;
            if self.checkpoints {
                let t = Instant::now();
                job.save_checkpoint(ctx.store(), json!({ "next": to + 1 }))
                    .await?;
                lock(&self.saves).push(t.elapsed());
            }
        }
        Ok(())
    }

    // After the outcome was written (and, in transactional handling, committed).
    async fn post_handle(&self, _record: &BenchJob, _outcome: &Outcome) {
        *lock(&self.finished) = Some(Instant::now());
    }
}

/// A fresh bench table with the progress columns and one job queued, an
/// empty items table; settled as every run starts.
async fn prepare(bench: &Bench) -> Result<()> {
    bench.fresh_table(0).await?;
    let mut columns = OptionalColumns::default();
    columns.progress = true;
    let ddl = optional_columns_sql(TABLE, &Default::default(), columns)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "{ddl}
         DROP TABLE IF EXISTS {ITEMS};
         CREATE TABLE {ITEMS} (job_id bigint NOT NULL, item bigint NOT NULL, PRIMARY KEY (job_id, item));
         INSERT INTO {TABLE} (queued_at) VALUES (now());"
    )))
    .execute(bench.admin())
    .await?;
    // Alone: VACUUM cannot run in the implicit transaction of several statements.
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {ITEMS}")))
        .execute(bench.admin())
        .await?;
    bench.settle().await
}

/// The job once, in `mode`, with or without a checkpoint per chunk.
async fn run(bench: &Bench, mode: Mode, sizes: Sizes, checkpoints: bool) -> Result<CheckpointRun> {
    prepare(bench).await?;
    // The worker's connections, and one for the chunks of heartbeat handling.
    let pool = bench.pool(framework::pool_size(mode, 1) + 1).await?;
    let mut options = framework::table_options();
    options.progress = true;
    let table = JobTable::new(&pool, options).await?;
    if !table.has_progress() {
        return Err("long: the bench table has no progress columns".into());
    }
    let store = Arc::new(DbStore::new(&pool, &table, framework::store_options(mode)).await?);
    let handler = Arc::new(Chunks {
        pool: pool.clone(),
        sizes,
        checkpoints,
        started: Mutex::default(),
        finished: Mutex::default(),
        saves: Mutex::default(),
    });
    let worker = new_worker(
        store,
        handler.clone(),
        framework::worker_options(1, Some(1))?,
    )?;
    bench.reset_statements().await?;
    let summary = tokio::time::timeout(RUN_TIMEOUT, worker.run()).await?;
    let statements = bench.statements().await?;
    pool.close().await;
    let (rows, seq, state): (i64, Option<i64>, String) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {ITEMS}), progress_seq, state FROM {TABLE}"
    )))
    .fetch_one(bench.admin())
    .await?;
    let saves = std::mem::take(&mut *lock(&handler.saves));
    let expected_saves = if checkpoints { sizes.chunks } else { 0 };
    if summary.dequeued != 1
        || state != "completed"
        || u64::try_from(rows)? != sizes.chunks * sizes.items
        || u64::try_from(saves.len())? != expected_saves
    {
        return Err(format!(
            "long: {mode} job {state}, {rows} items written, {} checkpoints saved (progress_seq {seq:?})",
            saves.len()
        )
        .into());
    }
    let (Some(started), Some(finished)) = (*lock(&handler.started), *lock(&handler.finished))
    else {
        return Err("long: the checkpointed job's handler never ran".into());
    };
    Ok(CheckpointRun {
        elapsed: finished.saturating_duration_since(started),
        saves,
        statements,
    })
}
