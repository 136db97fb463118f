//! Reading from a streaming replica: how far its replay is behind.

use super::{Statement, alias};
use sea_query::{Expr, Query};

/// How far the server this runs on is behind its primary: `(in recovery,
/// seconds since the last replayed transaction's commit or NULL, bytes
/// received but not yet replayed or NULL)`. On a primary `in recovery` is
/// false and the others NULL. The seconds grow while the primary is idle
/// (nothing new to replay), so the bytes tell an idle replica from a late one.
pub(crate) fn replica_lag() -> Statement {
    let q = Query::select()
        .expr_as(Expr::cust("pg_is_in_recovery()"), alias("in_recovery"))
        .expr_as(
            Expr::cust("EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8"),
            alias("replay_age_seconds"),
        )
        .expr_as(
            Expr::cust(
                "pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::bigint",
            ),
            alias("replay_lag_bytes"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    vec![("replica_lag", replica_lag())]
}
