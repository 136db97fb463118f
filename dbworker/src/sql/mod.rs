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
    Alias, Condition, Expr, ExprTrait, PostgresQueryBuilder, Query, TableRef, UpdateStatement,
};
use sea_query_sqlx::{SqlxBinder, SqlxValues};
use workerutil::JobState;

pub(crate) use crate::columns::quote;
use crate::columns::{Columns, Relation};
use crate::message::sanitize_failure_message;

mod admin;
mod admin_filter;
mod admin_search;
mod aging;
mod claim;
mod cluster;
mod consumer_members;
mod consumers;
mod control;
mod counts;
mod cron;
mod cursor;
mod enqueue;
mod execution_logs;
mod fairness;
mod gauges;
mod grants;
mod grouped_marks;
mod heartbeat;
mod history;
mod job_history;
mod known_types;
mod literal;
mod marks;
mod partition_keys;
mod partitions;
mod per_job;
mod pooler;
mod progress;
mod progress_table;
mod purge;
mod replica;
mod reset;
mod results;
mod schema;
mod signals;
mod suggest;
mod table;
mod workflow;

pub(crate) use admin::{
    admin_cancel_waiting, admin_complete, admin_count, admin_delete, admin_estimate, admin_fail,
    admin_hosts, admin_list, admin_recent, admin_remove_key, admin_request_cancel, admin_requeue,
    admin_reschedule, admin_select_ids, admin_show,
};
pub(crate) use admin_search::admin_list_window;
#[cfg(test)]
pub(crate) use claim::claim;
pub(crate) use claim::{
    CLAIM_BOUND, CLAIMED_CANCEL, CLAIMED_TOKEN, CLAIMED_TRACE_FOLLOWS, CLAIMED_TRACE_FRESH,
    CLAIMED_TRACE_PARENT, CLAIMED_TRACE_STATE, LimitedClaim, RECORD_ID, claim_limited, limited,
    lock_claimed, not_flagged, order_terms, select_records,
};
pub(crate) use cluster::{
    NodeRow, leader_acquire, leader_current, leader_fence, leader_release, leader_renew,
    leaders_all, node_deregister, node_heartbeat, node_register, nodes_all, nodes_live,
    nodes_prune,
};
pub(crate) use consumer_members::{log_member_beat, log_member_leave, log_members_prune};
pub(crate) use consumers::{
    LOG_HEAD, LOG_HEAD_XID, LOG_POSITION, LOG_WAITING, LOG_XID, LogTables, log_advance,
    log_assigned, log_assignments, log_checkpoint, log_head, log_held, log_lag,
    log_lock_assignment, log_pending, log_rebalance, log_scoped_slice, log_slice,
};
pub(crate) use control::{
    LIMIT_SETTINGS, LimitRow, claim_lane, claim_lock, list_limits, list_pauses, pause, pause_key,
    remove_limit, resume, set_limit,
};
pub(crate) use counts::{
    begin_index_only, counts_estimate, counts_explain, counts_finished, counts_live,
};
pub(crate) use cursor::{came_due, claim_cursor_condition, conditions_key, eligible_behind};
pub(crate) use suggest::suggest_values;
// The cron page's read; only the dashboard lists schedules.
#[cfg(feature = "dashboard")]
pub(crate) use cron::cron_list;
pub(crate) use cron::{cron_advance, cron_register, cron_state, cron_tick_timeouts};
pub(crate) use enqueue::{
    JobRow, OnKey, RunAt, copy_in, enqueue_keyed, enqueue_rows, explain_keyed_insert,
    live_job_with_key, release_key,
};
pub(crate) use execution_logs::{log_append, log_len, log_update};
pub(crate) use fairness::{
    fair_shares, fair_trigger_names, list_fair_weights, remove_fair_weight, set_fair_weight,
    tag_come_due,
};
pub(crate) use gauges::{any_queued, max_age_in_queue, queue_stats, queued_count};
pub(crate) use grants::{sequence_privilege, server_read_only, table_privileges};
pub(crate) use grouped_marks::{Mark, MarkKind, complete_group, mark_group};
pub(crate) use heartbeat::{HEARTBEAT_TOUCHED, HEARTBEAT_WROTE, heartbeat};
pub(crate) use history::ErrorHistory;
use history::append_history;
pub(crate) use job_history::{
    HOUR, history_bounds, history_by_queue, history_clock, history_downsample, history_finished,
    history_purge, history_record, history_series,
};
pub(crate) use marks::{
    mark_canceled, mark_complete, mark_complete_with_result, mark_errored,
    mark_errored_with_payload, mark_failed, requeue, requeue_if_paused, requeue_lost, snooze,
};
pub(crate) use partition_keys::{enqueue_keyed_partitioned, key_trigger_states};
pub(crate) use partitions::{
    archive_partition, closed_partitions, create_partitions, create_partitions_exists,
    detach_partition, drop_partition, partition_keeps_rows, partition_rows, set_lock_timeout,
};
pub(crate) use per_job::PerJob;
pub(crate) use pooler::{
    On, backend_pid, current_database, env_problem, pool_transaction_mode, terminate_backend,
};
pub use pooler::{Pooler, pooler, set_pooler};
pub(crate) use progress::{CLAIMED_PROGRESS_SEQ, read_checkpoint, running_jobs, write_progress};
pub(crate) use purge::{
    Archive, RecordedBy, purge_batch, row_security_hides_jobs, set_statement_timeout, sweep_orphans,
};
pub(crate) use replica::replica_lag;
pub(crate) use reset::reset_stalled;
pub(crate) use results::{record_upstreams, upstream_results};
pub(crate) use schema::{
    default_isolation, generated_column, insert_access, probe_expressions, relation_access,
    relation_columns, visible_unqualified,
};
pub(crate) use signals::{
    SIGNAL_TRACEPARENT, SignalTarget, consume_signal, lock_owned, mark_waiting, send_signal,
    signal_sent,
};
pub(crate) use table::{AgingParams, StoreParams, Table};
pub(crate) use workflow::{
    BATCH_CALLBACKS, batch_counts, cancel_blocked, deps_insert, lock_upstreams, lock_waited_for,
    mark_has_dependents, workflow_cancel_waiting, workflow_counts, workflow_graph, workflow_list,
    workflow_next_id, workflow_request_cancel, workflow_tasks,
};

/// A rendered statement with its bound values (cloned to send it again).
#[derive(Debug, Clone)]
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

    /// The statement as an sqlx query: sent only through the methods of
    /// `pooler.rs`, which choose how for the [`Pooler`] in force.
    fn query(self) -> sqlx::query::Query<'static, sqlx::Postgres, SqlxValues> {
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

/// `a.state IN ('queued','errored') AND (a.process_after IS NULL OR a.process_after <= now())`,
/// and `a.dbworker_live` on the HOT layout (see [`live`]).
fn eligible(a: &str, c: &Columns) -> Condition {
    live(
        Condition::all()
            .add(col(a, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]))
            .add(
                Condition::any()
                    .add(col(a, &c.process_after).is_null())
                    .add(col(a, &c.process_after).lte(Expr::cust("now()"))),
            ),
        a,
        c,
    )
}

/// `a.state = 'processing'`, and `a.dbworker_live` on the HOT layout.
fn processing(a: &str, c: &Columns) -> Condition {
    live(
        Condition::all().add(col(a, &c.state).eq(state(JobState::Processing))),
        a,
        c,
    )
}

/// `a.state = 'processing'` in a statement that joins its rows by id (the
/// grouped marks, the heartbeat). On the HOT layout the test is hidden from
/// the column's statistics: without the processing index, a table analyzed
/// while no job ran estimates one processing row, and the planner then
/// chose a scan of the whole table, joined to the marked jobs once per row
/// (measured: a completion of 700 jobs took 130–300 ms instead of about 5).
/// An expression has no statistics, so it is estimated at the default
/// (1/200 of the rows), and the join stays linear.
fn processing_by_id(a: &str, c: &Columns) -> Expr {
    if c.live {
        Expr::cust(format!(
            "COALESCE({}.{}, '') = 'processing'",
            quote(a),
            quote(&c.state)
        ))
    } else {
        col(a, &c.state).eq(state(JobState::Processing))
    }
}

/// [`live`] for statements written as text: `" AND a.dbworker_live"` on the
/// HOT layout (`a` already quoted), else nothing.
fn and_live(a: &str, c: &Columns) -> String {
    if c.live {
        format!(" AND {a}.{}", quote(crate::columns::LIVE))
    } else {
        String::new()
    }
}

/// On the HOT layout, ANDs `a.dbworker_live` into `cond`: implied by the
/// state test already, but the planner matches a partial index only by its
/// predicate's own column, and the layout's one index is `WHERE
/// dbworker_live`.
fn live(cond: Condition, a: &str, c: &Columns) -> Condition {
    if c.live {
        cond.add(col(a, crate::columns::LIVE))
    } else {
        cond
    }
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
    notify_with(channel, "")
}

/// `pg_notify(channel, payload)`: delivered when the transaction commits.
pub(crate) fn notify_with(channel: &str, payload: &str) -> Statement {
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "pg_notify($1, $2)",
            [channel.to_owned(), payload.to_owned()],
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

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
fn snapshots() -> Vec<(&'static str, Statement)> {
    vec![
        ("notify", notify("dbworker_jobs")),
        ("notify_with", notify_with("dbworker_jobs", "pause")),
        ("database_now_micros", database_now_micros()),
    ]
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
