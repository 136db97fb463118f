//! Every SQL statement dbworker runs: one function per statement, in a file per
//! feature, built with sea-query. The ground floor: statements take plain values
//! or the parameter structs defined here, never a feature module's type. Identifiers are quoted and
//! values are bound; the only raw SQL is what the user configured as SQL
//! (column expressions, order-by, extra conditions) and fixed fragments below.
//!
//! The fencing token of a claim is its `started_at` in microseconds. A claim
//! sets `started_at = GREATEST(now(), started_at + 1µs)`, so every claim of a row
//! gets a new, larger token, and every later write requires the token it got.

use std::sync::Arc;

use sea_query::{
    Alias, CommonTableExpression, Condition, Expr, ExprTrait, InsertStatement, IntoIden,
    LockBehavior, LockType, NullOrdering, OnConflict, Order, PostgresQueryBuilder, Query,
    SelectStatement, TableRef, UpdateStatement, WithClause,
};
use sea_query_sqlx::{SqlxBinder, SqlxValues};
use workerutil::{JobState, MAX_EXECUTION_LOG_ENTRIES};

pub(crate) use crate::columns::quote;
use crate::columns::{Columns, Relation};
use crate::message::sanitize_failure_message;
use crate::retry::{RetryPolicy, RetryRule};

mod admin;
mod batch;
mod claim;
mod cluster;
mod consumers;
mod control;
mod cron;
mod enqueue;
mod execution_logs;
mod gauges;
mod heartbeat;
mod history;
mod job_table;
mod marks;
mod partition_keys;
mod partitions;
mod per_job;
mod purge;
mod reset;
mod results;
mod schema;
mod workflow;

pub(crate) use admin::*;
pub(crate) use batch::*;
pub(crate) use claim::*;
pub(crate) use cluster::*;
pub(crate) use consumers::*;
pub(crate) use control::*;
pub(crate) use cron::*;
pub(crate) use enqueue::*;
pub(crate) use execution_logs::*;
pub(crate) use gauges::*;
pub(crate) use heartbeat::*;
pub(crate) use history::ErrorHistory;
use history::{append_history, appended};
pub(crate) use job_table::*;
pub(crate) use marks::*;
pub(crate) use partition_keys::*;
pub(crate) use partitions::*;
pub(crate) use per_job::PerJob;
pub(crate) use purge::*;
pub(crate) use reset::*;
pub(crate) use results::*;
pub(crate) use schema::*;
pub(crate) use workflow::*;

/// A rendered statement with its bound values.
#[derive(Debug)]
pub(crate) struct Statement {
    /// Shared, so a statement rendered once is sent without a copy.
    pub(crate) sql: Arc<str>,
    pub(crate) values: SqlxValues,
}

impl Statement {
    fn from(q: &impl SqlxBinder) -> Statement {
        let (sql, values) = q.build_sqlx(PostgresQueryBuilder);
        Statement {
            sql: sql.into(),
            values,
        }
    }

    /// The statement as an sqlx query.
    pub(crate) fn query(self) -> sqlx::query::Query<'static, sqlx::Postgres, SqlxValues> {
        sqlx::query_with(sqlx::AssertSqlSafe(self.sql), self.values)
    }
}

fn alias(name: &str) -> Alias {
    Alias::new(name)
}

fn table_ref(rel: &Relation) -> TableRef {
    plain_table(rel).alias(alias(&rel.alias))
}

/// The relation without its alias (`"schema"."name"` or `"name"`), for the
/// control tables, whose statements name their columns unqualified or by an
/// alias of their own.
fn plain_table(rel: &Relation) -> TableRef {
    match &rel.schema {
        Some(schema) => (alias(schema), alias(&rel.name)).into(),
        None => alias(&rel.name).into(),
    }
}

fn col(rel_alias: &str, name: &str) -> Expr {
    Expr::col((alias(rel_alias), alias(name)))
}

/// A state as a literal, not a bound value: the states are our own constants,
/// and a literal lets Postgres match the partial indexes (`WHERE state IN
/// ('queued', 'errored')`) in a cached generic plan, so a prepared claim or
/// mark need not be planned again on every call.
fn state(s: JobState) -> Expr {
    Expr::cust(format!("'{}'", s.as_str()))
}

/// The fencing token of the row aliased `a`.
fn token_expr(a: &str, c: &Columns) -> Expr {
    Expr::cust(format!(
        "(EXTRACT(EPOCH FROM {}.{}) * 1000000)::bigint",
        quote(a),
        quote(&c.started_at)
    ))
}

/// `COALESCE(a.column, 0)`: counters are read NULL-safe, so a nullable counter
/// holding NULL counts as 0 instead of making every comparison unknown.
fn counter(a: &str, column: &str) -> Expr {
    Expr::cust(format!("COALESCE({}.{}, 0)", quote(a), quote(column)))
}

/// `a.state IN ('queued','errored') AND (a.process_after IS NULL OR a.process_after <= now())`.
fn eligible(a: &str, c: &Columns) -> Condition {
    Condition::all()
        .add(col(a, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]))
        .add(
            Condition::any()
                .add(col(a, &c.process_after).is_null())
                .add(col(a, &c.process_after).lte(Expr::cust("now()"))),
        )
}

/// What a reset writes (the resetter's, or a requeue after a lost
/// connection): back to `queued` with one more reset, or `failed` with
/// `message` once the row was reset `max_num_resets` times.
fn reset_or_fail(
    q: &mut UpdateStatement,
    a: &str,
    c: &Columns,
    max_num_resets: u32,
    message: &str,
    history: Option<(&ErrorHistory, &str)>,
) {
    let can_requeue = || counter(a, &c.num_resets).lt(max_num_resets);
    // The history's entry: `requeue_note` when the row goes back, else `message`.
    if let Some((h, requeue_note)) = history {
        let entry = Expr::case(can_requeue(), Expr::val(requeue_note))
            .finally(Expr::val(sanitize_failure_message(message).as_ref()));
        append_history(q, Some(h), a, c, entry.into());
    }
    q.value(
        alias(&c.state),
        Expr::case(can_requeue(), state(JobState::Queued)).finally(state(JobState::Failed)),
    )
    .value(
        alias(&c.num_resets),
        Expr::case(can_requeue(), counter(a, &c.num_resets).add(1))
            .finally(counter(a, &c.num_resets)),
    )
    .value(
        alias(&c.failure_message),
        Expr::case(can_requeue(), col(a, &c.failure_message))
            .finally(sanitize_failure_message(message).as_ref()),
    )
    .value(
        alias(&c.finished_at),
        Expr::case(can_requeue(), Expr::cust("NULL")).finally(Expr::cust("now()")),
    );
}

/// `a.id = $id AND a.state = 'processing' AND token(a) = $token`: the lease guard.
fn owned(a: &str, c: &Columns, id: i64, token: i64) -> Condition {
    Condition::all()
        .add(col(a, &c.id).eq(id))
        .add(col(a, &c.state).eq(state(JobState::Processing)))
        .add(token_expr(a, c).eq(token))
}

/// Wakes the workers listening on `channel`.
pub(crate) fn notify(channel: &str) -> Statement {
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "pg_notify($1, '')",
            [channel.to_owned()],
        ))
        .to_owned();
    Statement::from(&q)
}

/// The database clock (the transaction's start) in microseconds since the epoch.
pub(crate) fn database_now_micros() -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM now()) * 1000000)::bigint"),
            alias("now"),
        )
        .to_owned();
    Statement::from(&q)
}

#[cfg(test)]
mod tests;
