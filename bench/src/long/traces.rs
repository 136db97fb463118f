//! Trace capture on enqueue: the same enqueues into a table with traces
//! (`dbworker migration --traces`) from inside a `tracing` span exported
//! through `tracing-opentelemetry`, and into the plain bench table with no
//! OpenTelemetry subscriber at all.
//!
//! Both tables exist side by side for a round, created fresh and settled
//! before it, and the round alternates between them in slices (plain,
//! traced, traced, plain, …): a slice lasts a fraction of a second, so a
//! change of the shared machine's weather falls on both sides of the round
//! alike, which whole runs one after the other could not promise. Each
//! producer task of a traced slice runs its enqueues inside one span of its
//! own, made before the clock starts, so what the traced side pays beyond
//! the plain one is the capture: reading the current span's context on
//! every call, and the columns it is stored in (plus their WAL). The spans
//! go to an exporter that drops them, through the simple processor, under
//! an INFO level filter (as an application exporting its spans would
//! filter): neither exporting nor the library's debug events are measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dbworker::ddl::{OptionalColumns, optional_columns_sql};
use dbworker::{Enqueuer, JobTable, JobTableOptions, NewJob};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use sqlx::AssertSqlSafe;
use tracing::Instrument as _;
use tracing::instrument::WithSubscriber as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;

use super::{plain_first, say};
use crate::Result;
use crate::db::{Bench, TABLE};
use crate::framework;
use crate::report::{EnqueueRun, count, rate};

/// An enqueue path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `Enqueuer::enqueue`: one INSERT and one commit per job.
    Single,
    /// `Enqueuer::enqueue_many` of [`MANY`] jobs: one INSERT in a transaction.
    Many,
}

/// Jobs per `enqueue_many` call.
pub(crate) const MANY: usize = 1_000;

impl Shape {
    pub(crate) const ALL: [Shape; 2] = [Shape::Single, Shape::Many];

    pub(crate) fn label(self) -> String {
        match self {
            Shape::Single => "enqueue, one job per call".to_owned(),
            Shape::Many => format!("enqueue_many, {} jobs per call", count(MANY as u64)),
        }
    }

    fn per_call(self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Many => MANY,
        }
    }
}

/// How much one round enqueues into each table: `calls` calls spread over
/// `tasks` tasks, in `slices` slices.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) calls: usize,
    pub(crate) tasks: usize,
    pub(crate) slices: usize,
}

/// The table with traces, beside the bench table (the plain one).
pub(super) const TRACED: &str = "bench_long_traced";

/// One round: the plain table and the traced one, in alternating slices,
/// the plain one first when it says.
#[derive(Debug)]
pub(crate) struct EnqueueRound {
    pub(crate) plain_first: bool,
    pub(crate) plain: EnqueueRun,
    pub(crate) traced: EnqueueRun,
}

impl EnqueueRound {
    /// Traced jobs/s ÷ plain jobs/s.
    pub(crate) fn ratio(&self) -> f64 {
        self.traced.rate() / self.plain.rate().max(1e-9)
    }
}

/// The rounds of one path.
#[derive(Debug)]
pub(crate) struct EnqueueRounds {
    pub(crate) shape: Shape,
    pub(crate) tasks: usize,
    pub(crate) slices: usize,
    pub(crate) rounds: Vec<EnqueueRound>,
}

/// `rounds` interleaved rounds of `shape`, plain and traced.
pub(crate) async fn rounds(
    bench: &Bench,
    shape: Shape,
    sizes: Sizes,
    rounds: usize,
) -> Result<EnqueueRounds> {
    let mut out = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let round = round(bench, shape, sizes, plain_first(r)).await?;
        say(format_args!(
            "traces: {}, round {}: plain {} jobs/s, traced {} jobs/s, traced ÷ plain {:.3}",
            shape.label(),
            r + 1,
            rate(round.plain.rate()),
            rate(round.traced.rate()),
            round.ratio()
        ));
        out.push(round);
    }
    Ok(EnqueueRounds {
        shape,
        tasks: sizes.tasks,
        slices: sizes.slices.clamp(1, sizes.calls.max(1)),
        rounds: out,
    })
}

/// Drops every span it is given, counting them.
#[derive(Debug, Clone, Default)]
pub(super) struct Dropped(pub(super) Arc<AtomicU64>);

impl SpanExporter for Dropped {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        self.0.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// A subscriber exporting through `tracing-opentelemetry` to [`Dropped`]
/// (INFO and above), as a dispatch the producer tasks run under.
pub(super) fn exporting(dropped: &Dropped) -> (SdkTracerProvider, tracing::Dispatch) {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(dropped.clone())
        .build();
    let tracer = provider.tracer("dbworker-bench");
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .with(LevelFilter::INFO);
    (provider, tracing::Dispatch::new(subscriber))
}

/// One `TraceContext::current()` inside an exported span, in this process
/// (no database): what the capture adds to each `enqueue` call (an
/// `enqueue_many` call reads it once for all its jobs). `None` if the
/// span had no valid context, so nothing would have been captured.
pub(crate) fn context_read(calls: u32) -> Option<Duration> {
    let dropped = Dropped::default();
    let (provider, dispatch) = exporting(&dropped);
    let per_call = tracing::dispatcher::with_default(&dispatch, || {
        let span = tracing::info_span!("producer");
        let _entered = span.enter();
        dbworker::TraceContext::current()?;
        let started = Instant::now();
        for _ in 0..calls {
            std::hint::black_box(dbworker::TraceContext::current());
        }
        Some(started.elapsed() / calls.max(1))
    });
    let _ = provider.shutdown();
    per_call
}

/// The traced table as its enqueuer sees it.
pub(super) fn traced_options() -> JobTableOptions {
    let mut options = JobTableOptions::new(format!("{TRACED} j"));
    options.column_expressions = vec!["j.id".into()];
    options.traces = true;
    options
}

/// Both tables fresh and empty, the traced one with the trace columns;
/// settled as every run starts.
pub(super) async fn fresh(bench: &Bench) -> Result<()> {
    bench.fresh_table(0).await?;
    let mut columns = OptionalColumns::default();
    columns.traces = true;
    let ddl = format!(
        "DROP TABLE IF EXISTS {TRACED};\n{}\n{}",
        dbworker::ddl::job_table_sql(TRACED, &Default::default())?,
        optional_columns_sql(TRACED, &Default::default(), columns)?
    );
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(bench.admin())
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TRACED}")))
        .execute(bench.admin())
        .await?;
    bench.settle().await
}

/// One table's enqueuer, the dispatch its tasks run under (the traced
/// side's), and what its slices took.
struct Side {
    enqueuer: Arc<Enqueuer>,
    dispatch: Option<tracing::Dispatch>,
    run: EnqueueRun,
    /// Spans that enqueued (one per busy task per slice): distinct contexts.
    spans: usize,
}

impl Side {
    fn new(enqueuer: Enqueuer, dispatch: Option<tracing::Dispatch>) -> Side {
        Side {
            enqueuer: Arc::new(enqueuer),
            dispatch,
            run: EnqueueRun {
                jobs: 0,
                elapsed: Duration::ZERO,
                statements: None,
            },
            spans: 0,
        }
    }

    /// `calls` calls of `shape` from `tasks` tasks, timed; the jobs are
    /// built before the clock starts.
    async fn slice(
        &mut self,
        bench: &Bench,
        shape: Shape,
        calls: usize,
        tasks: usize,
    ) -> Result<()> {
        let per_task: Vec<Vec<Vec<NewJob>>> = (0..tasks)
            .map(|t| {
                let n = calls / tasks + usize::from(t < calls % tasks);
                (0..n)
                    .map(|_| (0..shape.per_call()).map(|_| NewJob::new()).collect())
                    .collect()
            })
            .filter(|calls: &Vec<Vec<NewJob>>| !calls.is_empty())
            .collect();
        let jobs = u64::try_from(per_task.iter().flatten().map(Vec::len).sum::<usize>())?;
        self.spans += per_task.len();
        bench.reset_statements().await?;
        let started = Instant::now();
        let mut handles = Vec::with_capacity(per_task.len());
        for (t, calls) in per_task.into_iter().enumerate() {
            let enqueuer = self.enqueuer.clone();
            let work = async move {
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
                    }
                }
                Ok::<(), dbworker::Error>(())
            };
            handles.push(match &self.dispatch {
                // The span is made under the exporting subscriber, inside
                // the task, and entered on every poll of its enqueues.
                Some(dispatch) => tokio::spawn(
                    async move {
                        let span = tracing::info_span!("producer", task = t);
                        work.instrument(span).await
                    }
                    .with_subscriber(dispatch.clone()),
                ),
                None => tokio::spawn(work),
            });
        }
        for handle in handles {
            handle.await??;
        }
        self.run.elapsed += started.elapsed();
        self.run.jobs += jobs;
        let statements = bench.statements().await?;
        self.run.statements = match (self.run.statements, statements) {
            (Some(a), Some(b)) => Some(a + b),
            // The first slice (counting is on or off for the whole run).
            (None, b) => b,
            (Some(_), None) => None,
        };
        Ok(())
    }
}

/// One round of `shape`: both tables fresh, then `sizes.slices` slices of
/// each, alternating (plain first in the first slice when `plain_first`).
async fn round(
    bench: &Bench,
    shape: Shape,
    sizes: Sizes,
    plain_first: bool,
) -> Result<EnqueueRound> {
    fresh(bench).await?;
    let pool = bench
        .pool(u32::try_from(sizes.tasks).unwrap_or(u32::MAX))
        .await?;
    let plain_table = framework::job_table(&pool).await?;
    let traced_table = JobTable::new(&pool, traced_options()).await?;
    if plain_table.has_traces() || !traced_table.has_traces() {
        return Err("long: the plain table has traces, or the traced one has none".into());
    }
    let dropped = Dropped::default();
    let (provider, dispatch) = exporting(&dropped);
    let mut plain = Side::new(Enqueuer::new(&pool, &plain_table).await?, None);
    let mut traced = Side::new(Enqueuer::new(&pool, &traced_table).await?, Some(dispatch));
    let slices = sizes.slices.clamp(1, sizes.calls.max(1));
    for k in 0..slices {
        let calls = sizes.calls / slices + usize::from(k < sizes.calls % slices);
        let (first, second) = match plain_first == k.is_multiple_of(2) {
            true => (&mut plain, &mut traced),
            false => (&mut traced, &mut plain),
        };
        first.slice(bench, shape, calls, sizes.tasks).await?;
        second.slice(bench, shape, calls, sizes.tasks).await?;
    }
    pool.close().await;
    provider.shutdown()?;
    check(bench, &plain, &traced, &dropped).await?;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {TRACED}")))
        .execute(bench.admin())
        .await?;
    Ok(EnqueueRound {
        plain_first,
        plain: plain.run,
        traced: traced.run,
    })
}

/// Every job is in its table, and each traced one carries its task's
/// span (one distinct context per task and slice, every span exported).
async fn check(bench: &Bench, plain: &Side, traced: &Side, dropped: &Dropped) -> Result<()> {
    let (plain_rows, traced_rows, with_context, contexts): (i64, i64, i64, i64) =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {TABLE}), count(*), count(traceparent), \
             count(DISTINCT traceparent) FROM {TRACED}"
        )))
        .fetch_one(bench.admin())
        .await?;
    let exported = dropped.0.load(Ordering::Relaxed);
    let spans = i64::try_from(traced.spans)?;
    if u64::try_from(plain_rows)? != plain.run.jobs
        || u64::try_from(traced_rows)? != traced.run.jobs
        || with_context != traced_rows
        || contexts != spans
        || exported < u64::try_from(spans)?
    {
        return Err(format!(
            "long: plain {plain_rows} rows of {}; traced {traced_rows} of {}, {with_context} with \
             a trace context, {contexts} distinct (expected one per task and slice: {spans}); \
             {exported} spans exported",
            plain.run.jobs, traced.run.jobs
        )
        .into());
    }
    Ok(())
}
