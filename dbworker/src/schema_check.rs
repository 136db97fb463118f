//! The start-up check: the table, the view and every column exist with usable
//! types, and every configured SQL fragment is valid. All problems are
//! collected into one error.

use std::collections::HashMap;

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::columns::{Columns, Relation};
use crate::error::{Error, Result};
use crate::sql;
use crate::sql::StoreParams;

/// Opens one connection with the pool's settings, directly, so an unreachable
/// server or a refused login is reported with its real cause and the address
/// ([`Error::Connect`]) within `timeout`, not as a pool timeout after the
/// pool's acquire timeout (30 s by default). Made with `connect_lazy`, a pool
/// checked by this first fails fast. A pooler refusing sqlx's
/// `extra_float_digits` is named with the pgbouncer.ini line that fixes it,
/// and in [`Pooler::Direct`](crate::Pooler::Direct) mode a transaction pooler
/// found on the way ([`Error::InvalidOption`] for `pooler`) with the setting. Re-exported as
/// [`dbworker::check_connection`](crate::check_connection).
pub async fn probe_connection(pool: &PgPool, timeout: Duration) -> Result<()> {
    if let Some(reason) = sql::env_problem() {
        return Err(Error::InvalidOption {
            field: "DBWORKER_POOLER",
            reason,
        });
    }
    let options = pool.connect_options();
    let target = address(&options);
    let mut conn = connect_within(&options, timeout)
        .await
        .map_err(|reason| Error::Connect {
            target: target.clone(),
            reason,
        })?;
    let mode = sql::Pooler::of(pool);
    let checked = crate::pooler::check(&mode, &mut conn, &options, &target).await;
    let _ = conn.close().await;
    checked
}

/// Where `options` connect, as errors name it: `host:port`, or the socket
/// path (never the password).
pub(crate) fn address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// One connection with `options` within `timeout`, or why not, in words an
/// operator can act on: the server's own message, nothing listening, no
/// answer, or the pgbouncer.ini line a pooler's refusal needs.
async fn connect_within(
    options: &PgConnectOptions,
    timeout: Duration,
) -> std::result::Result<PgConnection, String> {
    let reason = match tokio::time::timeout(timeout, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => return Ok(conn),
        Ok(Err(sqlx::Error::Database(db))) => db.message().to_owned(),
        Ok(Err(err)) => {
            let chain = workerutil::error_chain(&err);
            if chain.to_lowercase().contains("refused") {
                format!(
                    "{chain} (nothing listens there: is the server running, and is the port right?)"
                )
            } else {
                chain
            }
        }
        Err(_) => format!(
            "no answer within the connect timeout of {timeout:?} (a wrong or unreachable host, a firewall dropping the packets, or a server too busy to answer; a longer connect timeout waits more)"
        ),
    };
    Err(match crate::pooler::startup_parameter_hint(&reason) {
        Some(hint) => format!("{reason}: {hint}"),
        None => reason,
    })
}

/// Behind a transaction pooler with a `listen_url`: fails unless it reaches
/// the pool's database (NOTIFY is per database, so a listener on another
/// would never wake a worker), naming both, or names the address and the
/// cause when it cannot be reached within `timeout`.
pub(crate) async fn check_listen_url(pool: &PgPool, timeout: Duration) -> Result<()> {
    let crate::Pooler::Transaction {
        listen_url: Some(url),
    } = sql::Pooler::of(pool)
    else {
        return Ok(());
    };
    let invalid = |reason: String| Error::InvalidOption {
        field: "listen_url",
        reason,
    };
    let options: PgConnectOptions = url
        .parse()
        .map_err(|e| invalid(format!("not a connection string: {e}")))?;
    let target = address(&options);
    let mut conn = connect_within(&options, timeout)
        .await
        .map_err(|reason| invalid(format!("cannot connect to {target} for LISTEN: {reason}")))?;
    let listening = sql::current_database().fetch_one_simple(&mut conn).await;
    let _ = conn.close().await;
    let listening: String = listening.map_err(Error::db("listen_url check"))?.get("db");
    let pooled: String = sql::current_database()
        .fetch_one(pool)
        .await
        .map_err(Error::db("listen_url check"))?
        .get("db");
    if listening != pooled {
        return Err(invalid(format!(
            "it reaches database {listening:?} at {target}, but the pool's database is {pooled:?}: NOTIFY is per database, so no wake-up would ever arrive; point listen_url (DBWORKER_LISTEN_URL) at {pooled:?}"
        )));
    }
    Ok(())
}

/// A column as `pg_catalog` describes it.
pub(crate) struct Column {
    pub(crate) ty: String,
    not_null: bool,
    has_default: bool,
    /// `pg_attribute.atttypmod`: a `timestamptz(p)`'s precision, -1 unset.
    typmod: i32,
}

/// The relation's columns by name; empty when it does not exist.
pub(crate) async fn columns_of(pool: &PgPool, rel: &Relation) -> Result<HashMap<String, Column>> {
    let rows = sql::relation_columns(rel)
        .fetch_all(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let column = Column {
                ty: r.get("type"),
                not_null: r.get("not_null"),
                has_default: r.get("has_default"),
                typmod: r.get("typmod"),
            };
            (r.get::<String, _>("name"), column)
        })
        .collect())
}

/// The relation's column names, in their table order; empty when it does
/// not exist.
pub(crate) async fn column_names(pool: &PgPool, rel: &Relation) -> Result<Vec<String>> {
    let rows = sql::relation_columns(rel)
        .fetch_all(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    Ok(rows.iter().map(|r| r.get("name")).collect())
}

/// What is wrong with `rel`, the `what` (a "pause table", an "archive table")
/// a feature relies on: missing (with `hint` on how to create it), or
/// missing any of `columns`.
pub(crate) async fn missing_columns(
    pool: &PgPool,
    rel: &Relation,
    what: &str,
    columns: &[&str],
    hint: &str,
) -> Result<Vec<String>> {
    let existing = columns_of(pool, rel).await?;
    let name = rel.display_name();
    if existing.is_empty() {
        return Ok(vec![format!("{what} {name} does not exist ({hint})")]);
    }
    Ok(columns
        .iter()
        .filter(|c| !existing.contains_key(**c))
        .map(|c| format!("{what} {name} has no column {c}"))
        .collect())
}

/// [`missing_columns`] as an error.
pub(crate) async fn require_columns(
    pool: &PgPool,
    rel: &Relation,
    what: &str,
    columns: &[&str],
    hint: &str,
) -> Result<()> {
    none(missing_columns(pool, rel, what, columns, hint).await?)
}

/// `Ok` when nothing is wrong, else the problems as one error.
pub(crate) fn none(problems: Vec<String>) -> Result<()> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema { problems })
    }
}

/// Whether the relation exists (resolved as Postgres resolves it, through
/// `search_path` when unqualified) and whether the role may read it (what a
/// service writes, it checks itself: `crate::grants`). Records what is
/// wrong; returns whether it exists.
pub(crate) async fn check_access(
    pool: &PgPool,
    rel: &Relation,
    what: &str,
    problems: &mut Vec<String>,
) -> Result<bool> {
    let name = rel.display_name();
    let row = sql::relation_access(rel)
        .fetch_optional(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    let Some(row) = row else {
        let hint = if rel.schema.is_none() {
            " in any schema of the search_path"
        } else {
            ""
        };
        problems.push(format!("{what} {name} does not exist{hint}"));
        return Ok(false);
    };
    let role: String = row.get("role");
    if !row.get::<bool, _>("may_select") {
        problems.push(format!(
            "role {role} lacks SELECT on {what} {name}: GRANT SELECT ON {name} TO {role}"
        ));
    }
    let kind: String = row.get("kind");
    if what == "table" && !matches!(kind.as_str(), "r" | "p") {
        problems.push(format!(
            "{name} is not a table (pg_class.relkind {kind:?}): table_name must name the job table; a view goes in view_name"
        ));
    }
    Ok(true)
}

/// Whether `rel` is a partitioned table (`pg_class.relkind` `p`); `false`
/// when it does not exist (its own check reports that).
pub(crate) async fn is_partitioned(pool: &PgPool, rel: &Relation) -> Result<bool> {
    let row = sql::relation_access(rel)
        .fetch_optional(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    Ok(row.is_some_and(|r| r.get::<String, _>("kind") == "p"))
}

/// Checks that `rel` exists, that the role may select it, and that
/// it has every standard column, typed as expected, with counters that cannot
/// silently hold NULL and a `process_after` that can.
pub(crate) async fn check_table(
    pool: &PgPool,
    rel: &Relation,
    columns: &Columns,
    problems: &mut Vec<String>,
) -> Result<()> {
    if !check_access(pool, rel, "table", problems).await? {
        return Ok(());
    }
    let table_columns = columns_of(pool, rel).await?;
    let table = rel.display_name();
    for (standard, name, types) in columns.expected_types() {
        let renamed = if standard == name {
            String::new()
        } else {
            format!(" (standard column {standard})")
        };
        match table_columns.get(name) {
            None => problems.push(format!("table {table} has no column {name}{renamed}")),
            Some(col) if standard == "id" && matches!(col.ty.as_str(), "int2" | "int4") => {
                problems.push(format!(
                    "column {table}.{name}{renamed} has type {}, but job ids are 64-bit (every record id is an i64): ALTER TABLE {table} ALTER COLUMN {name} TYPE bigint",
                    col.ty
                ));
            }
            Some(col) if !types.contains(&col.ty.as_str()) => problems.push(format!(
                "column {table}.{name}{renamed} has type {}, expected one of {}",
                col.ty,
                types.join(", ")
            )),
            Some(_) => {}
        }
    }
    // The claim's token is `started_at` in microseconds, moved on by at
    // least one at each claim: rounded to a coarser precision, a new claim
    // could hold the token of the one before it.
    if let Some(col) = table_columns.get(&columns.started_at)
        && (0..6).contains(&col.typmod)
    {
        let name = &columns.started_at;
        problems.push(format!(
            "column {table}.{name} is timestamptz({}), but claim tokens need its microseconds: ALTER TABLE {table} ALTER COLUMN {name} TYPE timestamptz",
            col.typmod
        ));
    }
    // Columns dbworker writes NULL to: each write would fail on a NOT NULL
    // one (a hand-back at shutdown left to the resetter, a requeue refused).
    let nulled = [
        (
            &columns.process_after,
            "for a job due at once (COPY without a run-at, a requeue, a hand-back at shutdown)",
        ),
        (&columns.started_at, "for a job requeued to run again"),
        (
            &columns.finished_at,
            "at every claim (a new attempt has not finished)",
        ),
        (&columns.last_heartbeat_at, "for a job no worker runs"),
        (
            &columns.failure_message,
            "at every claim (a new attempt has not failed)",
        ),
        (
            &columns.execution_logs,
            "at every claim (a new attempt has logged nothing)",
        ),
    ];
    for (name, when) in nulled {
        if table_columns.get(name).is_some_and(|col| col.not_null) {
            problems.push(format!(
                "column {table}.{name} is NOT NULL, but dbworker writes NULL there {when}: ALTER TABLE {table} ALTER COLUMN {name} DROP NOT NULL"
            ));
        }
    }
    for name in [&columns.num_failures, &columns.num_resets] {
        if let Some(col) = table_columns.get(name)
            && !col.not_null
            && !col.has_default
        {
            problems.push(format!(
                "column {table}.{name} is a counter but nullable with no default, so new rows would hold NULL: ALTER TABLE {table} ALTER COLUMN {name} SET DEFAULT 0 (and UPDATE … SET {name} = 0 WHERE {name} IS NULL; ALTER … SET NOT NULL)"
            ));
        }
    }
    Ok(())
}

/// Why `column` of `rel` cannot serve as `option` (a `jsonb` column), if it cannot.
pub(crate) async fn jsonb_column_problem(
    pool: &PgPool,
    rel: &Relation,
    column: &str,
    option: &str,
    hint: &str,
) -> Result<Option<String>> {
    let table = rel.display_name();
    Ok(match columns_of(pool, rel).await?.get(column) {
        None => Some(format!(
            "table {table} has no column {column} ({option}){hint}"
        )),
        Some(col) if col.ty != "jsonb" => Some(format!(
            "column {table}.{column} ({option}) has type {}, expected jsonb",
            col.ty
        )),
        Some(_) => None,
    })
}

/// Checks a store's SQL fragments (column expressions, order-by) against the
/// table or view they read; the table itself was checked by `JobTable::new`.
pub(crate) async fn check_store(
    pool: &PgPool,
    o: &StoreParams,
    connect_timeout: Duration,
) -> Result<()> {
    probe_connection(pool, connect_timeout).await?;
    if let Err(err) = sql::probe_expressions(o).execute(pool).await {
        let detail = match &err {
            sqlx::Error::Database(db) => db.message().to_owned(),
            other => other.to_string(),
        };
        return none(vec![format!(
            "the column expressions or order_by are not valid against {}: {detail}",
            o.source().display_name()
        )]);
    }
    Ok(())
}

/// What is wrong with the pause table `rel` (missing, or missing columns).
pub(crate) async fn pause_table_problems(pool: &PgPool, rel: &Relation) -> Result<Vec<String>> {
    missing_columns(
        pool,
        rel,
        "pause table",
        &["job_table", "queue", "paused_at", "paused_by"],
        "`dbworker migration --pauses` prints it",
    )
    .await
}

/// What is wrong with the limit table `rel` (missing, or missing columns).
pub(crate) async fn limit_table_problems(pool: &PgPool, rel: &Relation) -> Result<Vec<String>> {
    missing_columns(
        pool,
        rel,
        "limit table",
        &[["job_table", "queue"].as_slice(), &sql::LIMIT_SETTINGS].concat(),
        "`dbworker migration --limits` prints it",
    )
    .await
}
