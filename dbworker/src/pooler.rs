//! The start-up probe for the [`Pooler`](crate::Pooler) in force: it tells a
//! transaction pooler between this process and PostgreSQL from a direct (or
//! session-pooled) connection, and refuses to start in
//! [`Pooler::Direct`](crate::Pooler::Direct) behind one, naming the setting,
//! before the first named statement lands on another client's server
//! connection. Run by every start-up check ([`crate::check_connection`]).

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, Row};

use crate::error::{Error, Result};
use crate::sql;

/// How long the probe waits for a statement while another of its sessions
/// holds a transaction open; a transaction pooler with one server connection
/// makes it wait, so it then gives up (undecided) rather than block start-up.
const WAIT: Duration = Duration::from_millis(500);

async fn pid(conn: &mut PgConnection) -> sqlx::Result<i32> {
    Ok(sql::backend_pid().fetch_one_simple(conn).await?.get("pid"))
}

/// The evidence of a transaction pooler, if the probe found some: two
/// connections of ours served by one server process, or one connection
/// served by two. Neither can happen on direct connections (a backend serves
/// one session for its life), so a direct connection is never reported.
/// `first` is an open connection made with `options`.
pub(crate) async fn transaction_pooler_evidence(
    first: &mut PgConnection,
    options: &PgConnectOptions,
) -> sqlx::Result<Option<String>> {
    let mut second = PgConnection::connect_with(options).await?;
    let a1 = pid(first).await?;
    let mut tx = second.begin().await?;
    let b1 = pid(&mut tx).await?;
    let evidence = if a1 == b1 {
        Some(format!(
            "two client connections were served by one server process ({a1})"
        ))
    } else {
        match tokio::time::timeout(WAIT, pid(first)).await {
            Ok(Ok(a2)) if a2 != a1 => Some(format!(
                "one client connection was served by server processes {a1} and then {a2}"
            )),
            Ok(Ok(_)) | Err(_) => None,
            Ok(Err(err)) => return Err(err),
        }
    };
    tx.rollback().await?;
    let _ = second.close().await;
    Ok(evidence)
}

/// The error for a transaction pooler found while `Pooler::Direct` is chosen.
pub(crate) fn direct_behind_pooler(target: &str, evidence: &str) -> Error {
    Error::InvalidOption {
        field: "pooler",
        reason: format!(
            "the connections to {target} go through a pooler in transaction mode \
             ({evidence}), but dbworker is in Pooler::Direct mode, whose named \
             prepared statements fail there; call \
             Pooler::Transaction {{ listen_url }}.apply_to(&pool) (or \
             dbworker::set_pooler for the whole process, or DBWORKER_POOLER=transaction) \
             at start-up, or point the pool at PostgreSQL \
             or at a session-mode pool"
        ),
    }
}

/// In `Pooler::Direct` mode (the pool's), fails when `first`'s server is reached through
/// a transaction pooler; in transaction mode there is nothing to check.
pub(crate) async fn check(
    mode: &crate::Pooler,
    first: &mut PgConnection,
    options: &PgConnectOptions,
    target: &str,
) -> Result<()> {
    if mode.is_transaction() {
        return Ok(());
    }
    let probe = transaction_pooler_evidence(first, options);
    match tokio::time::timeout(WAIT * 4, probe).await {
        Ok(Ok(Some(evidence))) => Err(direct_behind_pooler(target, &evidence)),
        Ok(Ok(None)) | Err(_) => Ok(()),
        // A probe that cannot run decides nothing; the statements that follow
        // report whatever is wrong with the connection.
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "the pooler probe could not run");
            Ok(())
        }
    }
}

/// The hint for a connection a pooler refused because of a startup
/// parameter sqlx sends (`extra_float_digits`), if that is why.
pub(crate) fn startup_parameter_hint(reason: &str) -> Option<&'static str> {
    reason.contains("unsupported startup parameter").then_some(
        "a pooler (PgBouncer) refuses a startup parameter sqlx sends: add \
         `ignore_startup_parameters = extra_float_digits` to the [pgbouncer] \
         section of pgbouncer.ini and reload it",
    )
}

/// A handler's failure `message` with the cause and the fix appended, when
/// behind a transaction pooler it failed on a statement prepared under a
/// name (sqlx's default): another client's statement of that name was on the
/// server connection, or the one prepared before is on another.
pub(crate) fn named_statement_hint(pool: &sqlx::PgPool, message: &str) -> Option<String> {
    let named = message.contains("prepared statement \"sqlx_s_")
        && (message.contains("already exists") || message.contains("does not exist"));
    (named && crate::Pooler::of(pool).is_transaction()).then(|| {
        format!(
            "{message} (behind a transaction pooler a statement must not be prepared under a \
             name, and sqlx's query() prepares one by default: add .persistent(false) to the \
             handler's query, or reach PostgreSQL directly or through a session pooler)"
        )
    })
}
