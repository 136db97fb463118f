//! Item jobs: a job whose payload is a JSON array of items, handled item by
//! item.
//!
#![doc = include_str!("../docs/modules/items.md")]

use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use workerutil::{BoxError, Handler, HandlerError, JobContext, Record, Retry, error_chain};

use crate::store::{DbJob, DbStore};

/// What became of one item: `Ok` done, `Err` to be retried (with the reason).
pub type ItemResult = Result<(), BoxError>;

/// Handles the items of item jobs; wrap it in [`ItemJobs`] to get a
/// [`Handler`].
///
/// The handler is not given the job's transaction: when some items fail, the
/// job's transaction is rolled back, while the items that succeeded are
/// dropped from the payload and never run again. Commit what an item does
/// yourself, before reporting it done.
pub trait ItemHandler<R>: Send + Sync + 'static {
    /// Handles `items` (the job's payload array, or what is left of it) and
    /// returns one result per item, in order.
    fn handle_items(
        &self,
        record: &R,
        items: &[Value],
    ) -> impl Future<Output = Vec<ItemResult>> + Send;

    /// The retry policy of these jobs, as [`Handler::retry`]. Default `None`:
    /// the store's.
    fn retry(&self, _record: &R) -> Option<Retry> {
        None
    }
}

/// Reads a record's payload.
type PayloadOf<R> = Arc<dyn Fn(&R) -> &Value + Send + Sync>;

/// A [`Handler`] that runs a [`ItemHandler`] over the items of each job's
/// payload. Needs a store whose table has a
/// [`payload_column`](crate::JobTableOptions::payload_column) naming the column
/// `payload_of` reads.
///
/// - Every item succeeded (or the array is empty): the job completes.
/// - Some failed: the job errors with a message naming each failed item (by
///   its index in this attempt's payload), and its payload becomes the array
///   of the failed items, in the same fenced statement as the errored mark
///   ([`DbJob::retry_with_payload`]). Retries are counted and delayed as for
///   any job; once they are exhausted the job fails with the items left.
/// - The payload is not an array, or the handler returned a result count that
///   differs from the item count: the job fails at once (non-retryable), with
///   the reason.
pub struct ItemJobs<R, H> {
    handler: H,
    payload_of: PayloadOf<R>,
}

impl<R, H> std::fmt::Debug for ItemJobs<R, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemJobs").finish_non_exhaustive()
    }
}

impl<R, H: ItemHandler<R>> ItemJobs<R, H> {
    /// Runs `handler` over the array `payload_of` reads from each record.
    pub fn new(
        handler: H,
        payload_of: impl Fn(&R) -> &Value + Send + Sync + 'static,
    ) -> ItemJobs<R, H> {
        ItemJobs {
            handler,
            payload_of: Arc::new(payload_of),
        }
    }
}

/// The name of a JSON value's type, for error messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
impl<R: Record, H: ItemHandler<R>> Handler<DbStore<R>> for ItemJobs<R, H> {
    async fn handle(
        &self,
        job: &mut DbJob<R>,
        ctx: &JobContext<DbStore<R>>,
    ) -> Result<(), HandlerError> {
        if ctx.store().payload_column().is_none() {
            return Err(HandlerError::non_retryable(
                "item jobs need the table's payload column (JobTableOptions::payload_column: the jsonb column holding the items)",
            ));
        }
        let payload = (self.payload_of)(job.record());
        let Value::Array(items) = payload else {
            return Err(HandlerError::non_retryable(format!(
                "an item job's payload must be a JSON array of items, not {}",
                type_name(payload)
            )));
        };
        let results = self.handler.handle_items(job.record(), items).await;
        if results.len() != items.len() {
            return Err(HandlerError::non_retryable(format!(
                "the item handler returned {} results for {} items",
                results.len(),
                items.len()
            )));
        }
        let mut left = Vec::new();
        let mut reasons = Vec::new();
        for (index, (item, result)) in items.iter().zip(results).enumerate() {
            if let Err(err) = result {
                left.push(item.clone());
                reasons.push(format!("item {index}: {}", error_chain(err.as_ref())));
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        let message = format!(
            "{} of {} items failed ({})",
            left.len(),
            items.len(),
            reasons.join("; ")
        );
        job.retry_with_payload(Value::Array(left));
        Err(HandlerError::retryable(message))
    }

    fn retry(&self, record: &R) -> Option<Retry> {
        self.handler.retry(record)
    }
}
