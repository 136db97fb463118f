//! Reading from a streaming replica: how far behind its primary it is, so a
//! page or a command that reads from it can say how old what it shows may be.

use std::time::Duration;

use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::sql;

/// How far the server a pool reaches is behind its primary.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ReplicaLag {
    /// Whether the server is a replica (in recovery); `false` on a primary,
    /// whose lag is none.
    pub in_recovery: bool,
    /// Time since the last transaction it replayed committed on the primary
    /// (`now() - pg_last_xact_replay_timestamp()`). It also grows while the
    /// primary writes nothing, so read it with [`behind_bytes`](Self::behind_bytes).
    pub replay_age: Option<Duration>,
    /// WAL received but not replayed yet, in bytes.
    pub behind_bytes: Option<u64>,
}

impl ReplicaLag {
    /// One line for people: `last replayed commit 1.2 s ago, 0 bytes of WAL
    /// still to replay`.
    pub fn describe(&self) -> String {
        if !self.in_recovery {
            return "not a replica: reads come from the primary".to_owned();
        }
        let age = match self.replay_age {
            Some(age) => format!("last replayed commit {:.1} s ago", age.as_secs_f64()),
            None => "nothing replayed yet".to_owned(),
        };
        match self.behind_bytes {
            Some(bytes) => format!("{age}, {bytes} bytes of WAL still to replay"),
            None => age,
        }
    }
}

/// How far the server `pool` reaches is behind its primary.
pub async fn replica_lag(pool: &PgPool) -> Result<ReplicaLag> {
    let row = sql::replica_lag()
        .fetch_one(pool)
        .await
        .map_err(Error::db("replica_lag"))?;
    let age: Option<f64> = row.get("replay_age_seconds");
    let bytes: Option<i64> = row.get("replay_lag_bytes");
    Ok(ReplicaLag {
        in_recovery: row.get("in_recovery"),
        // A replica's clock a little behind the primary's gives a small negative age.
        replay_age: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
        behind_bytes: bytes.map(|b| u64::try_from(b).unwrap_or(0)),
    })
}
