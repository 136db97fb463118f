//! Enqueue through `Enqueuer` from one connection: tagged jobs into the fair
//! table beside untagged ones into the plain table, in each of the three
//! paths, on a queue in use (a backlog already waiting, the table analyzed);
//! then a COPY into a new, empty table, where the trigger's statements are
//! planned on the empty table (a scan of it all per row) and stay so for
//! the statement. Every row inserted into the fair table runs the tagging
//! trigger, and a BEFORE ROW trigger also keeps COPY from inserting in
//! batches.

use std::time::Instant;

use dbworker::{Enqueuer, NewJob};
use sqlx::AssertSqlSafe;

use crate::Result;
use crate::db::{Bench, TABLE};
use crate::framework;
use crate::report::{EnqueueRun, count, rate};

/// Jobs waiting before an enqueue run on a queue in use.
pub(crate) const IN_USE: u64 = 10_000;

/// An enqueue path and how much of it a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `enqueue`: one INSERT, one commit per job.
    Single,
    /// `enqueue_many` of 100 jobs: one INSERT of 100 rows in a transaction.
    Many,
    /// `enqueue_copy` of 10,000 jobs: one COPY.
    Copy,
    /// One `enqueue_copy` of 10,000 jobs into a new, empty table.
    CopyIntoNew,
}

impl Shape {
    pub(crate) const ALL: [Shape; 4] =
        [Shape::Single, Shape::Many, Shape::Copy, Shape::CopyIntoNew];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Shape::Single => "enqueue, one job per call",
            Shape::Many => "enqueue_many, 100 jobs per call",
            Shape::Copy => "enqueue_copy, 10,000 jobs per call",
            Shape::CopyIntoNew => "enqueue_copy, 10,000 jobs, into a new, empty table",
        }
    }

    pub(crate) fn per_call(self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Many => 100,
            Shape::Copy | Shape::CopyIntoNew => 10_000,
        }
    }

    /// Calls per run: a few seconds of each on a 2-core machine (a single
    /// enqueue waits for its commit's flush). Into a new table one COPY:
    /// another session's ANALYZE replans the trigger's statements between
    /// two statements, never within one.
    fn calls(self) -> usize {
        match self {
            Shape::Single => 2_000,
            Shape::Many => 200,
            Shape::Copy => 10,
            Shape::CopyIntoNew => 1,
        }
    }

    /// Jobs waiting in the table before the run.
    pub(crate) fn waiting_before(self) -> u64 {
        match self {
            Shape::CopyIntoNew => 0,
            _ => IN_USE,
        }
    }
}

/// A path into the plain table, then into the fair one.
#[derive(Debug)]
pub(crate) struct EnqueuePair {
    pub(crate) shape: Shape,
    pub(crate) plain: EnqueueRun,
    pub(crate) fair: EnqueueRun,
}

impl EnqueuePair {
    pub(crate) fn summary(&self) -> String {
        format!(
            "{}: {} jobs, plain {} jobs/s, fair {} jobs/s; fair ÷ plain {:.3}",
            self.shape.label(),
            count(self.plain.jobs),
            rate(self.plain.rate()),
            rate(self.fair.rate()),
            self.fair.rate() / self.plain.rate().max(1e-9)
        )
    }
}

/// `shape` into the plain table, then into the fair one (jobs over `keys` keys).
pub(crate) async fn pair(bench: &Bench, shape: Shape, keys: u64) -> Result<EnqueuePair> {
    let plain = run(bench, shape, false, keys).await?;
    let fair = run(bench, shape, true, keys).await?;
    Ok(EnqueuePair { shape, plain, fair })
}

/// The jobs of `n` calls of `shape`: tagged with `keys` keys in turn for the
/// fair table, untagged for the plain one (which has no fair_key column).
pub(crate) fn calls(shape: Shape, n: usize, fair: bool, keys: u64) -> Vec<Vec<NewJob>> {
    (0..n)
        .map(|call| {
            (0..shape.per_call())
                .map(|i| match fair {
                    true => NewJob::new().fair_key(super::key(call * shape.per_call() + i, keys)),
                    false => NewJob::new(),
                })
                .collect()
        })
        .collect()
}

/// One path into a fresh table holding `shape.waiting_before()` jobs, on a
/// new pool of one connection; the jobs are built before the clock starts.
async fn run(bench: &Bench, shape: Shape, fair: bool, keys: u64) -> Result<EnqueueRun> {
    let before = shape.waiting_before();
    super::prepare(bench, fair, before, keys, 5_000).await?;
    let pool = bench.pool(1).await?;
    let table = framework::job_table(&pool).await?;
    super::expect_fair(&table, fair)?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;
    let calls = calls(shape, shape.calls(), fair, keys);
    let jobs = u64::try_from(calls.iter().map(Vec::len).sum::<usize>())?;
    bench.reset_statements().await?;
    let started = Instant::now();
    for call in calls {
        match shape {
            Shape::Single => {
                for job in call {
                    enqueuer.enqueue(job).await?;
                }
            }
            Shape::Many => {
                enqueuer.enqueue_many(call).await?;
            }
            Shape::Copy | Shape::CopyIntoNew => {
                enqueuer.enqueue_copy(&call).await?;
            }
        }
    }
    let elapsed = started.elapsed();
    let statements = bench.statements().await?;
    pool.close().await;
    let (rows, tagged): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*), count(*) FILTER (WHERE {}) FROM {TABLE}",
        if fair { "fair_tag > 0" } else { "false" }
    )))
    .fetch_one(bench.admin())
    .await?;
    // Every key's jobs after its first wait behind it: the trigger ran.
    if u64::try_from(rows)? != before + jobs || (fair && tagged == 0 && jobs > keys) {
        return Err(format!("{}: {rows} rows ({tagged} tagged) of {jobs}", shape.label()).into());
    }
    Ok(EnqueueRun {
        jobs,
        elapsed,
        statements,
    })
}
