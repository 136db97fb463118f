//! The claim of a table with a limit table. Claims run in claim lanes
//! (advisory locks, `LANES` per table) instead of one at a time:
//!
//! - a claim takes a free lane and, in it, claims only while every limited
//!   queue has room for what all lanes together may take at once
//!   (`LANES × LANE_CLAIM_MAX`): the claims it cannot see yet are those in
//!   flight in the other lanes, each taking at most `LANE_CLAIM_MAX`, so no
//!   queue can pass its limit, and it waits for no one;
//! - otherwise (a limit is near, a queue is limited per key, no lane is free,
//!   or the lane claim came back short) it takes every lane in order and
//!   claims as before, seeing every claim before it and ranking rows within
//!   each queue's exact room.
//!
//! Why the lanes suffice: take the claim that committed last among those that
//! counted a given moment's jobs; every claim it could not see was in flight
//! when it looked, each in a lane of its own.

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::PgPool;
use sqlx::postgres::PgRow;

use crate::error::{Error, Result};
use crate::sql::{self, LimitedClaim, Statement, StoreParams};

/// Claim lanes per job table.
pub(super) const LANES: u32 = 4;
/// The most rows a claim in a lane takes.
pub(super) const LANE_CLAIM_MAX: usize = 1_024;

/// Spreads this process's claims over the lanes.
static NEXT_LANE: AtomicU32 = AtomicU32::new(0);

/// Claims up to `limit` rows; `build` renders the claim of so many rows in a
/// mode.
pub(super) async fn claim(
    pool: &PgPool,
    o: &StoreParams,
    limit: usize,
    build: impl Fn(usize, LimitedClaim) -> Statement,
) -> Result<Vec<PgRow>> {
    let in_lane = limit.min(LANE_CLAIM_MAX);
    let threshold = u64::from(LANES) * LANE_CLAIM_MAX as u64;
    let first = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % LANES;
    let mut tx = pool.begin().await.map_err(Error::db("begin"))?;
    let lane = sql::claim_lane(o, LANES, first)
        .fetch_optional(sql::On::conn_of(pool, &mut tx))
        .await
        .map_err(Error::db("claim_lane"))?;
    let mut rows = Vec::new();
    if lane.is_some() {
        rows = build(in_lane, LimitedClaim::Lane { threshold })
            .fetch_all(sql::On::conn_of(pool, &mut tx))
            .await
            .map_err(Error::db("claim"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        if rows.len() == in_lane {
            return Ok(rows);
        }
    } else {
        drop(tx);
    }
    let rest = limit - rows.len();
    let serialized = async {
        let mut tx = pool.begin().await.map_err(Error::db("begin"))?;
        sql::claim_lock(o, LANES)
            .execute(sql::On::conn_of(pool, &mut tx))
            .await
            .map_err(Error::db("claim_lock"))?;
        let more = build(rest, LimitedClaim::Serialized)
            .fetch_all(sql::On::conn_of(pool, &mut tx))
            .await
            .map_err(Error::db("claim"))?;
        tx.commit().await.map_err(Error::db("commit"))?;
        Ok::<_, Error>(more)
    };
    match serialized.await {
        Ok(more) => rows.extend(more),
        // The lane's rows are committed as this worker's: they run, or no
        // worker would until the resetter took them back.
        Err(err) if !rows.is_empty() => {
            tracing::warn!(table = %o.table.display_name(), error = %err, claimed = rows.len(), "the serialized step of a limited claim failed; the lane's jobs run");
        }
        Err(err) => return Err(err),
    }
    Ok(rows)
}
