//! The cost of the operations features in heartbeat handling, beside the plain
//! path in the same run: kinds dispatch through a `KindRegistry` that restricts
//! the claim, and a queue under a global concurrency limit or a rate limit
//! that never binds (every claim serialized behind the table's advisory lock;
//! the rate's bucket spent by each claim).

use std::sync::Arc;

use dbworker::{
    DbConditions, DbJob, DbStore, Handling, JobTable, StoreOptions, control::DEFAULT_LIMIT_TABLE,
    new_worker,
};
use sqlx::AssertSqlSafe;
use workerutil::{Handler, HandlerError, JobContext, KindRegistry, Outcome, Record};

use crate::Result;
use crate::db::{Bench, Mode, TABLE};
use crate::framework::{self, NoOp, Progress};
use crate::report::Run;

/// What a run exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// No kinds, no limits: the heartbeat burn-down.
    Plain,
    /// One kind registered, the claim restricted to it (`kind = ANY($1)`).
    Kinds,
    /// The queue limited to more jobs than exist: the limit never binds, so
    /// this is the price of the serialized, limit-aware claim.
    Limited,
    /// The queue under a rate far above the throughput: the price of the
    /// token bucket the claim reads and spends.
    RateLimited,
}

impl Variant {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Kinds => "kinds: KindRegistry, claim restricted to its kind",
            Variant::Limited => "global limit on the queue (never reached)",
            Variant::RateLimited => "rate limit on the queue (never reached)",
        }
    }
}

/// A bench job with its kind.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KindJob {
    id: i64,
    kind: String,
}

impl Record for KindJob {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Does nothing; counts recorded outcomes.
struct KindNoOp {
    progress: Arc<Progress>,
}
impl Handler<DbStore<KindJob>> for KindNoOp {
    async fn handle(
        &self,
        _job: &mut DbJob<KindJob>,
        _ctx: &JobContext<DbStore<KindJob>>,
    ) -> std::result::Result<(), HandlerError> {
        Ok(())
    }

    async fn post_handle(&self, _record: &KindJob, _outcome: &Outcome) {
        self.progress.add(1);
    }
}

/// `jobs` queued jobs with `kind` and `queue` columns, and a limit table
/// holding the variant's limit.
pub(crate) async fn prepare(bench: &Bench, variant: Variant, jobs: u64, batch: u64) -> Result<()> {
    bench.prepare(0, jobs, batch).await?;
    let limits = dbworker::ddl::limit_table_sql(DEFAULT_LIMIT_TABLE)?;
    let limit = match variant {
        Variant::RateLimited => "NULL, 1e9, 2000000000, 2e9",
        _ => "2000000000, NULL, NULL, 0",
    };
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER TABLE {TABLE} ADD COLUMN kind text NOT NULL DEFAULT 'bench', ADD COLUMN queue text NOT NULL DEFAULT 'bench';
         {limits}
         DELETE FROM {DEFAULT_LIMIT_TABLE};
         INSERT INTO {DEFAULT_LIMIT_TABLE} (job_table, queue, max_processing, rate_per_second, burst, tokens)
         VALUES ('{TABLE}', 'bench', {limit});"
    )))
    .execute(bench.admin())
    .await?;
    // Apart: VACUUM cannot run in the transaction of a multi-statement string.
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {TABLE}")))
        .execute(bench.admin())
        .await?;
    Ok(())
}

/// Burns down the prepared jobs with `handlers` handlers in `variant`.
pub(crate) async fn burn(
    bench: &Bench,
    variant: Variant,
    handlers: usize,
    jobs: u64,
) -> Result<Run> {
    let connections = framework::pool_size(Mode::Heartbeat, handlers);
    let pool = bench.pool(connections).await?;
    let progress = Progress::new();
    let options = framework::worker_options(handlers, Some(jobs))?;
    let run = async {
        bench.reset_statements().await?;
        let summary = match variant {
            Variant::Plain | Variant::Limited | Variant::RateLimited => {
                let o = framework::store_options(Mode::Heartbeat);
                let mut to = framework::table_options();
                if variant != Variant::Plain {
                    to.queue_column = Some("queue".into());
                    to.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
                }
                let table = JobTable::new(&pool, to).await?;
                let store = Arc::new(DbStore::new(&pool, &table, o).await?);
                let handler = NoOp {
                    progress: progress.clone(),
                    starts: None,
                };
                new_worker(store, handler, options)?.run().await
            }
            Variant::Kinds => {
                let mut o = StoreOptions::new("bench");
                o.handling = Handling::Heartbeat;
                let mut to = framework::table_options();
                to.column_expressions = vec!["j.id".into(), "j.kind".into()];
                let table = JobTable::new(&pool, to).await?;
                let store = Arc::new(DbStore::new(&pool, &table, o).await?);
                let registry = KindRegistry::<DbStore<KindJob>>::new(|j: &KindJob| j.kind.as_str())
                    .register(
                        "bench",
                        KindNoOp {
                            progress: progress.clone(),
                        },
                    )?
                    .restrict_dequeue(|kinds| DbConditions::new().column_in("j.kind", kinds));
                new_worker(store, registry, options)?.run().await
            }
        };
        Result::Ok(summary)
    };
    framework::measure(bench, &pool, &progress, jobs, variant.label(), run).await
}
