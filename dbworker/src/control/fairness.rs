//! The weights of a fair table's keys, and each key's share of its work.

use sqlx::{PgPool, Row};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql;
use crate::table::JobTable;

/// The largest weight a key may have.
pub const MAX_FAIR_WEIGHT: u32 = crate::columns::MAX_FAIR_WEIGHT;

/// One key's work on a fair table: what waits, what runs, and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairShare {
    /// The key (`None`: jobs without one, which share one key).
    pub key: Option<String>,
    /// Its jobs waiting (queued or errored).
    pub waiting: u64,
    /// Its jobs processing.
    pub processing: u64,
    /// Its weight (1 unless set).
    pub weight: u32,
}

/// Sets the weights of a fair table's keys (`dbworker migration --fair`):
/// while backlogged, a key of weight 4 is claimed four times as often as
/// one of weight 1, within a priority. A weight applies to the jobs tagged
/// after it is set (the next enqueue, retry or release of the key's jobs);
/// jobs already waiting keep their place.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use dbworker::control::FairWeights;
/// let jobs = dbworker::JobTable::new(&pool, dbworker::JobTableOptions::detected("jobs")).await?;
/// let weights = FairWeights::new(&pool, &jobs).await?;
/// weights.set("enterprise-7", 4).await?;
/// for share in weights.shares(20).await? {
///     println!("{:?}: {} waiting, weight {}", share.key, share.waiting, share.weight);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FairWeights {
    pool: PgPool,
    table: JobTable,
    weights: Relation,
}

impl FairWeights {
    /// The weights of `table`, which must be fair ([`JobTable::is_fair`]).
    /// Checks that the role may read them (`SELECT`); a tool that sets
    /// weights checks [`check_writes`](Self::check_writes) too.
    pub async fn new(pool: &PgPool, table: &JobTable) -> Result<FairWeights> {
        let Some(weights) = table.sql().fair_weights.clone() else {
            return Err(Error::InvalidOption {
                field: "fair",
                reason: format!(
                    "table {} has no fair claims (`dbworker migration --fair` adds them)",
                    table.name()
                ),
            });
        };
        let w = FairWeights {
            pool: pool.clone(),
            table: table.clone(),
            weights,
        };
        w.check(&[Privilege::Select], "reading fair weights")
            .await?;
        Ok(w)
    }

    async fn check(&self, privileges: &[Privilege], needed_by: &'static str) -> Result<()> {
        Grants::new(needed_by)
            .on("weight table", &self.weights, privileges)
            .check(&self.pool)
            .await
    }

    /// Checks the grants setting (`INSERT`, `UPDATE`) and removing
    /// (`DELETE`) weights use, naming each missing one with its `GRANT`.
    pub async fn check_writes(&self) -> Result<()> {
        self.check(
            &[
                Privilege::Select,
                Privilege::Insert,
                Privilege::Update,
                Privilege::Delete,
            ],
            "setting fair weights",
        )
        .await
    }

    /// Gives `key` weight `weight` (1 to [`MAX_FAIR_WEIGHT`]).
    pub async fn set(&self, key: &str, weight: u32) -> Result<()> {
        if weight == 0 || weight > MAX_FAIR_WEIGHT {
            return Err(Error::InvalidOption {
                field: "weight",
                reason: format!("must be between 1 and {MAX_FAIR_WEIGHT}, not {weight}"),
            });
        }
        sql::set_fair_weight(&self.weights, key, weight as i32)
            .execute(&self.pool)
            .await
            .map_err(Error::db("set_fair_weight"))?;
        Ok(())
    }

    /// Puts `key` back to weight 1; returns whether it had another.
    pub async fn remove(&self, key: &str) -> Result<bool> {
        let done = sql::remove_fair_weight(&self.weights, key)
            .execute(&self.pool)
            .await
            .map_err(Error::db("remove_fair_weight"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The weights set, by key (every other key has weight 1).
    pub async fn list(&self) -> Result<Vec<(String, u32)>> {
        let rows = sql::list_fair_weights(&self.weights)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("list_fair_weights"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let weight: i32 = r.get("weight");
                (r.get("fair_key"), weight.max(1) as u32)
            })
            .collect())
    }

    /// The `limit` keys with the most jobs waiting, with what runs and their weight.
    pub async fn shares(&self, limit: u32) -> Result<Vec<FairShare>> {
        let rows = sql::fair_shares(self.table.sql(), &self.weights, u64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("fair_shares"))?;
        Ok(rows
            .iter()
            .map(|r| FairShare {
                key: r.get("fair_key"),
                waiting: r.get::<i64, _>("waiting").max(0) as u64,
                processing: r.get::<i64, _>("processing").max(0) as u64,
                weight: r.get::<i32, _>("weight").max(1) as u32,
            })
            .collect())
    }
}
