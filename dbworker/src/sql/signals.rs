//! Durable waits and signals: the wait mark's three statements (lock the job
//! row, look in the mailbox, mark), a resumed attempt's fenced consumption,
//! and the sender's call of the table's signal function.

use super::claim::cte;
use super::marks::back_to_queue;
use super::{Statement, StoreParams, alias, col, owned, table_ref};
use crate::columns::{AWAITING, Relation, quote};
use sea_query::{Expr, ExprTrait, LockType, Query, WithClause};

/// The wait mark's first statement: locks the job's row `FOR NO KEY UPDATE`
/// if its claim still owns it (senders lock it the same way first), `(id)`.
pub(crate) fn lock_owned(o: &StoreParams, id: i64, token: i64) -> Statement {
    let t = &o.table;
    let q = Query::select()
        .expr_as(col(&t.alias, &o.columns.id), alias("id"))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .lock_with_tables(LockType::NoKeyUpdate, [alias(&t.alias)])
        .to_owned();
    Statement::from(&q)
}

/// Whether a signal `name` for the job waits in the mailbox, unconsumed:
/// `(sent)`. Run after [`lock_owned`], in a statement of its own, so its
/// snapshot sees every sender that committed before the lock was granted.
pub(crate) fn signal_sent(signals: &Relation, id: i64, name: &str) -> Statement {
    let s = &signals.alias;
    let exists = Query::select()
        .expr(Expr::val(1))
        .from(table_ref(signals))
        .and_where(col(s, "job_id").eq(id))
        .and_where(col(s, "name").eq(name))
        .and_where(col(s, "consumed_at").is_null())
        .to_owned();
    let q = Query::select()
        .expr_as(Expr::exists(exists), alias("sent"))
        .to_owned();
    Statement::from(&q)
}

/// The wait mark: back to `queued` (or `canceled` when cancellation was
/// asked), to run at once when its signal was `sent`, else after `timeout`
/// waiting for `name`. Fenced by the token.
pub(crate) fn mark_waiting(
    o: &StoreParams,
    id: i64,
    token: i64,
    name: &str,
    timeout: std::time::Duration,
    sent: bool,
    span: Option<&str>,
) -> Statement {
    // The clock now, not `now()`: in transactional handling the mark runs
    // in the job's transaction, whose `now()` is when it began.
    let (run_at, awaiting) = if sent {
        (Expr::cust("clock_timestamp()"), Expr::cust("NULL"))
    } else {
        (
            Expr::cust_with_values(
                "clock_timestamp() + make_interval(secs => $1)",
                [timeout.as_secs_f64()],
            ),
            Expr::val(name),
        )
    };
    let mut q = back_to_queue(o, id, token, run_at)
        .value(alias(AWAITING), awaiting)
        .to_owned();
    super::marks::record_span(&mut q, o, span);
    Statement::from(&q)
}

/// Consumes the oldest unconsumed signal `name` of a job its claim still
/// owns, recording the token: `(payload)`, or no row; with
/// `signal_traces`, also the sender's `(traceparent)`.
pub(crate) fn consume_signal(
    o: &StoreParams,
    signals: &Relation,
    id: i64,
    token: i64,
    name: &str,
) -> Statement {
    let t = &o.table;
    let s = &signals.alias;
    let oldest = Query::select()
        .column((alias("dbworker_oldest"), alias("id")))
        .from_as(super::plain_table(signals), alias("dbworker_oldest"))
        .and_where(col("dbworker_oldest", "job_id").eq(id))
        .and_where(col("dbworker_oldest", "name").eq(name))
        .and_where(col("dbworker_oldest", "consumed_at").is_null())
        .order_by(("dbworker_oldest", "id"), sea_query::Order::Asc)
        .limit(1)
        .lock(LockType::Update)
        .to_owned();
    // The job's row locked, its claim checked on its newest version: a
    // reset and a new claim that committed while this waited (for the
    // mailbox row) leave the signal to the new attempt, and a reset waits
    // until this consumption commits.
    let ours = Query::select()
        .expr(Expr::val(1))
        .from(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .lock(LockType::Share)
        .to_owned();
    let mut returned = vec![Expr::cust(format!("{}.\"payload\"", quote(s)))];
    if o.signal_traces {
        returned.push(Expr::cust(format!(
            "{}.{}",
            quote(s),
            quote(SIGNAL_TRACEPARENT)
        )));
    }
    let q = Query::update()
        .table(table_ref(signals))
        .value(alias("consumed_at"), Expr::cust("now()"))
        .value(alias("consumed_token"), token)
        .and_where(col(s, "id").in_subquery(oldest))
        .and_where(Expr::exists(ours))
        .returning(Query::returning().exprs(returned))
        .to_owned();
    Statement::from(&q)
}

/// The mailbox's column for the sender's span (see `ddl::signals_sql`),
/// returned under this name by [`consume_signal`].
pub(crate) const SIGNAL_TRACEPARENT: &str = "traceparent";

/// Sends a signal through the table's function (`<table>_signal`, or
/// `<table>_signal_key` when `key` addresses the job): `(sent)`, whether it
/// is new. With the sender's span `trace`, the session setting
/// `dbworker.traceparent` holds it while the function runs (the mailbox's
/// column defaults to it) and is given back its value after, so a send in
/// the caller's transaction leaves its setting as it was.
pub(crate) fn send_signal(
    table: &Relation,
    to: SignalTarget<'_>,
    (name, payload): (&str, Option<serde_json::Value>),
    dedupe: Option<&str>,
    trace: Option<&str>,
) -> Statement {
    let (function, target) = match to {
        SignalTarget::Id(id) => (
            table.quoted_derived_sibling("signal"),
            sea_query::Value::from(id),
        ),
        SignalTarget::Key(key) => (
            table.quoted_derived_sibling("signal_key"),
            sea_query::Value::from(key.to_owned()),
        ),
    };
    let call = Expr::cust_with_values(
        format!("{function}($1, $2, $3::jsonb, $4)"),
        [
            target,
            sea_query::Value::from(name.to_owned()),
            sea_query::Value::from(payload),
            sea_query::Value::from(dedupe.map(str::to_owned)),
        ],
    );
    let Some(trace) = trace else {
        let q = Query::select().expr_as(call, alias("sent")).to_owned();
        return Statement::from(&q);
    };
    // Each step reads the one before it, so they run in order: the old
    // value read, the sender's span set, the function called, the old value
    // set again.
    const SETTING: &str = "'dbworker.traceparent'";
    let before = Query::select()
        .expr_as(
            Expr::cust(format!("current_setting({SETTING}, true)")),
            alias("before"),
        )
        .to_owned();
    let set = Query::select()
        .column((alias(TRACE_BEFORE), alias("before")))
        .expr_as(
            Expr::cust_with_values(
                format!("set_config({SETTING}, $1, true)"),
                [trace.to_owned()],
            ),
            alias("sender"),
        )
        .from(alias(TRACE_BEFORE))
        .to_owned();
    let sent = Query::select()
        .column((alias(TRACE_SET), alias("before")))
        .expr_as(call, alias("sent"))
        .from(alias(TRACE_SET))
        .to_owned();
    let q = Query::select()
        .column((alias(TRACE_SENT), alias("sent")))
        .expr_as(
            Expr::cust(format!(
                "set_config({SETTING}, COALESCE({}.\"before\", ''), true)",
                quote(TRACE_SENT)
            )),
            alias("restored"),
        )
        .from(alias(TRACE_SENT))
        .to_owned();
    let with = WithClause::new()
        .cte(cte(before, TRACE_BEFORE, true))
        .cte(cte(set, TRACE_SET, true))
        .cte(cte(sent, TRACE_SENT, true))
        .to_owned();
    Statement::from(&q.with(with))
}

/// The steps of a send with the sender's span (see [`send_signal`]).
const TRACE_BEFORE: &str = "dbworker_before";
/// See [`TRACE_BEFORE`].
const TRACE_SET: &str = "dbworker_traced";
/// See [`TRACE_BEFORE`].
const TRACE_SENT: &str = "dbworker_sent";

/// Which job a signal is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SignalTarget<'a> {
    /// By id.
    Id(i64),
    /// The live job holding a key.
    Key(&'a str),
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{resolved, with_traces};
    let t = resolved(false);
    let signals = crate::columns::signals_table(&t.table);
    let mut traced = with_traces();
    traced.signal_traces = true;
    let hour = std::time::Duration::from_secs(3600);
    vec![
        ("lock_owned", lock_owned(&t, 1, 2)),
        ("signal_sent", signal_sent(&signals, 1, "paid")),
        (
            "mark_waiting",
            mark_waiting(&t, 1, 2, "paid", hour, false, None),
        ),
        (
            "mark_waiting_sent",
            mark_waiting(&t, 1, 2, "paid", hour, true, None),
        ),
        ("consume_signal", consume_signal(&t, &signals, 1, 2, "paid")),
        (
            "consume_signal_with_traces",
            consume_signal(&traced, &signals, 1, 2, "paid"),
        ),
        (
            "send_signal",
            send_signal(
                &t.table,
                SignalTarget::Id(1),
                ("paid", Some(serde_json::json!({"amount": 5}))),
                Some("evt_1"),
                None,
            ),
        ),
        (
            "send_signal_key",
            send_signal(
                &t.table,
                SignalTarget::Key("order:7"),
                ("paid", None),
                None,
                None,
            ),
        ),
        (
            "send_signal_traced",
            send_signal(
                &t.table,
                SignalTarget::Id(1),
                ("paid", None),
                None,
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
        ),
    ]
}
