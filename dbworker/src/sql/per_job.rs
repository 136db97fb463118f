//! The statements a transactional job runs on its own, rendered once per store.
//!
//! Every transactional job locks its row and marks it completed: two
//! statements whose text depends only on the store's options, with the id and
//! the token as their only values. Rendering them with sea-query for each job
//! cost several microseconds of the worker's CPU per job (allocation-heavy
//! expression trees), measurable once the server is fast enough. They are
//! rendered once here, by the same functions, and only the values change.

use std::sync::Arc;

use sea_query::{Value, Values};
use sea_query_sqlx::SqlxValues;

use super::{Statement, StoreParams, lock_claimed, mark_complete};

/// `lock_claimed` and `mark_complete`, rendered for one job table.
#[derive(Debug, Clone)]
pub(crate) struct PerJob {
    lock_claimed: Arc<str>,
    mark_complete: Arc<str>,
}

impl PerJob {
    pub(crate) fn new(o: &StoreParams) -> PerJob {
        PerJob {
            lock_claimed: lock_claimed(o, 0, 0).sql,
            mark_complete: mark_complete(o, 0, 0, None).sql,
        }
    }

    /// [`lock_claimed`] for this job.
    pub(crate) fn lock_claimed(&self, id: i64, token: i64) -> Statement {
        fenced(&self.lock_claimed, id, token)
    }

    /// [`mark_complete`] for this job.
    pub(crate) fn mark_complete(&self, id: i64, token: i64) -> Statement {
        fenced(&self.mark_complete, id, token)
    }
}

/// Both statements bind `$1` = id and `$2` = token (the fence of `owned`).
fn fenced(sql: &Arc<str>, id: i64, token: i64) -> Statement {
    Statement {
        sql: sql.clone(),
        values: SqlxValues(Values(vec![
            Value::BigInt(Some(id)),
            Value::BigInt(Some(token)),
        ])),
    }
}
