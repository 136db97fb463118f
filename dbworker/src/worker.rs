//! Building a `workerutil::Worker` over a `DbStore`, with the checks that only
//! make sense for Postgres.

use std::sync::Arc;

use workerutil::{Handler, Record, Worker, WorkerOptions};

use crate::error::Result;
use crate::store::DbStore;

/// Builds a worker over `store`, checking first that the pool and the timing
/// options fit the store ([`DbStore::check_worker`]), with this crate's error.
/// [`Worker::new`] runs the same check, so calling it directly is safe too.
pub fn new_worker<R, H>(
    store: Arc<DbStore<R>>,
    handler: H,
    options: WorkerOptions,
) -> Result<Worker<DbStore<R>, H>>
where
    R: Record,
    H: Handler<DbStore<R>>,
{
    options.validate()?;
    store.check_worker(&options, workerutil::claim_ahead(&options, &*store))?;
    Ok(Worker::new(store, handler, options)?)
}

/// A worker is a service like the others: it runs until `stop` fires, then
/// shuts down gracefully (running jobs get its drain timeout). It runs once
/// ([`Worker::run_until`]).
impl<R, H> crate::Service for Worker<DbStore<R>, H>
where
    R: Record,
    H: Handler<DbStore<R>>,
{
    fn name(&self) -> &str {
        Worker::name(self)
    }

    async fn run(&self, stop: tokio_util::sync::CancellationToken) -> Result<()> {
        self.run_until(stop).await?;
        Ok(())
    }
}
