//! Building a `workerutil::Worker` over a `DbStore`, with the checks that only
//! make sense for Postgres.

use std::sync::Arc;

use workerutil::{Handler, Record, Worker, WorkerOptions};

use crate::error::{Error, Result};
use crate::options::Handling;
use crate::store::DbStore;

/// Connections a worker needs besides its handlers: one for claims and one for
/// heartbeats.
pub const RESERVED_CONNECTIONS: u32 = 2;

/// Builds a worker over `store`, checking that the pool and the timing options
/// fit together:
///
/// - transactional handling holds a connection per running handler, so the
///   pool needs `num_handlers + 2` connections, or every connection could end up
///   in a handler while the claim waits for one (a deadlock);
/// - heartbeats must come at least twice per stalled max age, or the resetter
///   would requeue live jobs;
/// - a worker must give up its jobs (`heartbeat_failure_limit`) before the
///   resetter may hand them to someone else (`stalled_max_age`).
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
    let stalled = store.stalled_max_age();
    if options.heartbeat_interval * 2 > stalled {
        return Err(Error::InvalidOption {
            field: "heartbeat_interval",
            reason: format!(
                "{:?} is more than half the store's stalled_max_age ({stalled:?}); live jobs would be reset",
                options.heartbeat_interval
            ),
        });
    }
    match options.heartbeat_failure_limit {
        Some(limit) if limit < stalled => {}
        other => {
            return Err(Error::InvalidOption {
                field: "heartbeat_failure_limit",
                reason: format!(
                    "{other:?} must be set and below the store's stalled_max_age ({stalled:?}), so a worker that cannot heartbeat stops its jobs before they are reset"
                ),
            });
        }
    }
    let max = store.pool().options().get_max_connections();
    let handlers = u32::try_from(options.num_handlers).unwrap_or(u32::MAX);
    let needed = match store.handling() {
        Handling::Transactional => handlers.saturating_add(RESERVED_CONNECTIONS),
        Handling::Heartbeat => RESERVED_CONNECTIONS,
    };
    if max < needed {
        return Err(Error::PoolTooSmall {
            max_connections: max,
            needed,
            reason: match store.handling() {
                Handling::Transactional => format!(
                    "transactional handling holds one per handler: {handlers} handlers + {RESERVED_CONNECTIONS} for claims and heartbeats"
                ),
                Handling::Heartbeat => "one for claims and one for heartbeats".to_owned(),
            },
        });
    }
    Ok(Worker::new(store, handler, options)?)
}
