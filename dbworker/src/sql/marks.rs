//! Every mark of a claimed job (complete, with a result, errored, errored
//! with a batch job's items left, failed, snoozed, requeued, lost), single
//! and grouped (several jobs' marks written by one statement), each fenced by
//! the claim's token.

use super::{Statement, alias, col, counter, owned, reset_or_fail, state, table_ref};
use crate::columns::TRACE_FOLLOWS;
use crate::columns::{Columns, quote};
use crate::message::sanitize_failure_message;
use crate::retry::{RetryPolicy, RetryRule};
use crate::sql::history::append_history;
use crate::sql::table::StoreParams;
use sea_query::{Condition, Expr, ExprTrait, Query, UpdateStatement};
use workerutil::JobState;

pub(super) fn fenced_update(o: &StoreParams, id: i64, token: i64) -> UpdateStatement {
    let t = &o.table;
    Query::update()
        .table(table_ref(t))
        .cond_where(owned(&t.alias, &o.columns, id, token))
        .to_owned()
}

/// A completion drops the job's checkpoint (its progress stays): the work it
/// resumed is done.
pub(super) fn drop_checkpoint(q: &mut UpdateStatement, o: &StoreParams) {
    if o.progress {
        q.value(alias(crate::columns::CHECKPOINT), Expr::cust("NULL"));
    }
}

/// Marks a claimed job completed. Runs inside the handler's transaction in
/// transactional handling, where `now()` is the transaction's start: times use
/// `clock_timestamp()`. With traces, records `span` (see [`record_span`]):
/// a dependent this completion releases links to it.
pub(crate) fn mark_complete(o: &StoreParams, id: i64, token: i64, span: Option<&str>) -> Statement {
    let c = &o.columns;
    let mut q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    drop_checkpoint(&mut q, o);
    record_span(&mut q, o, span);
    super::progress_table::completion(q, o)
}

/// The job's retry limit: its own column's value when the table has one and it
/// is set, else `max_num_retries` (the store's, or its kind's).
pub(super) fn max_retries(o: &StoreParams, a: &str, max_num_retries: u32) -> Expr {
    match &o.max_retries_column {
        Some(column) => Expr::cust_with_values(
            format!("COALESCE({}.{}, $1)", quote(a), quote(column)),
            [i64::from(max_num_retries)],
        ),
        None => Expr::val(max_num_retries),
    }
}

/// The delay before the next retry, in SQL over the row's `num_failures` (the
/// value before this failure is counted). The exponent stops where the delay
/// reaches `max_delay`: `LEAST` compares only after `power` is computed, and
/// `power` overflows float8 (an error, not infinity) after about a thousand
/// failures at the default factor, which would leave the job unmarkable.
pub(super) fn retry_delay(a: &str, c: &Columns, r: &RetryPolicy) -> Expr {
    let (after, max, factor, steps) = backoff_bounds(r);
    Expr::cust_with_values(
        format!(
            "make_interval(secs => LEAST($1::float8, $2::float8 * power($3::float8, LEAST(COALESCE({}.{}, 0), $5::integer))) * (1 + $4::float8 * (2 * random() - 1)))",
            quote(a),
            quote(&c.num_failures)
        ),
        [
            sea_query::Value::from(max),
            sea_query::Value::from(after),
            sea_query::Value::from(factor),
            sea_query::Value::from(r.jitter),
            sea_query::Value::from(steps),
        ],
    )
}

/// The longest delay bound: a century, as every other duration's cap, and
/// well inside what an interval holds.
const MAX_DELAY_SECS: f64 = 100.0 * 365.25 * 86_400.0;

/// `(retry_after, max_delay, backoff_factor, steps)` as the delay's SQL
/// binds them: the delays in seconds (the cap at most a century), the
/// factor at least 1 (and at most 10^290, so one step past the cap stays a
/// float8), and the fewest failures after which `retry_after · factorⁿ`
/// reaches the cap, so the power never grows past it.
fn backoff_bounds(r: &RetryPolicy) -> (f64, f64, f64, i32) {
    let max = r.max_delay.as_secs_f64().min(MAX_DELAY_SECS);
    let after = r.retry_after.as_secs_f64().min(max);
    let factor = if r.backoff_factor.is_finite() {
        r.backoff_factor.clamp(1.0, 1e290)
    } else {
        1.0
    };
    let steps = if after <= 0.0 || factor <= 1.0 {
        0
    } else {
        // factor^steps ≤ (max / after) · factor: never past float8.
        let steps = ((max / after).ln() / factor.ln()).ceil().clamp(0.0, 1e9);
        // Clamped into i32's range first: the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation)]
        let steps = steps as i32;
        steps
    };
    (after, max, factor, steps)
}

/// Records a retryable failure: `canceled` if cancellation was requested,
/// `failed` once retries are exhausted, else `errored` with `process_after`
/// set to the next retry time. `retry` is the store's rule or the job kind's:
/// its values are bound, so every rule shares one statement.
pub(crate) fn mark_errored(
    o: &StoreParams,
    id: i64,
    token: i64,
    message: &str,
    retry: &RetryRule,
    span: Option<&str>,
) -> Statement {
    let mut q = errored_update(o, id, token, message, retry);
    record_span(&mut q, o, span);
    Statement::from(&q)
}

/// With traces, records `span` (the `traceparent` this attempt ran under)
/// for the next attempt to link to (a retry, an operator's requeue of a
/// failed or canceled job) and for the dependents a final mark releases
/// (the release trigger copies it to them); in the mark's own fenced
/// statement, so a stale attempt records nothing.
pub(crate) fn record_span(q: &mut UpdateStatement, o: &StoreParams, span: Option<&str>) {
    if let (true, Some(span)) = (o.traces, span) {
        q.value(alias(TRACE_FOLLOWS), span);
    }
}

/// `RETURNING` the state a mark wrote, as text named `state`.
fn returning_state(a: &str, c: &Columns) -> sea_query::ReturningClause {
    Query::returning().expr(Expr::cust(format!(
        "{}.{}::text AS \"state\"",
        quote(a),
        quote(&c.state)
    )))
}

/// The update of [`mark_errored`], for statements that write more beside it.
pub(super) fn errored_update(
    o: &StoreParams,
    id: i64,
    token: i64,
    message: &str,
    retry: &RetryRule,
) -> UpdateStatement {
    let c = &o.columns;
    let a = &o.table.alias;
    let limit = retry.max_num_retries;
    let exhausted = || {
        counter(a, &c.num_failures)
            .add(1)
            .gt(max_retries(o, a, limit))
    };
    let q = fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(col(a, &c.cancel), state(JobState::Canceled))
                .case(exhausted(), state(JobState::Failed))
                .finally(state(JobState::Errored)),
        )
        .value(
            alias(&c.process_after),
            Expr::case(
                Condition::any().add(col(a, &c.cancel)).add(exhausted()),
                col(a, &c.process_after),
            )
            .finally(Expr::cust("now()").add(retry_delay(a, c, &retry.policy))),
        )
        .to_owned();
    failed_attempt(q, o, message)
}

/// What every failed attempt writes besides its state: one more failure, the
/// message, when it finished, and (with an error history) its entry. It
/// returns the state written: a retry, a final failure or a cancel.
fn failed_attempt(mut q: UpdateStatement, o: &StoreParams, message: &str) -> UpdateStatement {
    let (a, c) = (&o.table.alias, &o.columns);
    let message = sanitize_failure_message(message);
    append_history(
        &mut q,
        o.error_history.as_ref(),
        a,
        c,
        Expr::val(message.as_ref()),
    );
    q.value(alias(&c.num_failures), counter(a, &c.num_failures).add(1))
        .value(alias(&c.failure_message), message.as_ref())
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .returning(returning_state(a, c));
    q
}

/// Records a final failure: `canceled` if cancellation was requested, else
/// `failed`; with traces, the attempt's `span` (see [`record_span`]).
pub(crate) fn mark_failed(
    o: &StoreParams,
    id: i64,
    token: i64,
    message: &str,
    span: Option<&str>,
) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let mut q = fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(col(a, &c.cancel), state(JobState::Canceled))
                .finally(state(JobState::Failed)),
        )
        .to_owned();
    record_span(&mut q, o, span);
    Statement::from(&failed_attempt(q, o, message))
}

/// Cancels a claimed job at its handler's request: `canceled` (its cancel
/// flag set, as a requested cancel leaves it), with the reason; with
/// traces, the attempt's `span` (see [`record_span`]).
pub(crate) fn mark_canceled(
    o: &StoreParams,
    id: i64,
    token: i64,
    message: &str,
    span: Option<&str>,
) -> Statement {
    let c = &o.columns;
    let mut q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Canceled))
        .value(alias(&c.cancel), true)
        .to_owned();
    record_span(&mut q, o, span);
    Statement::from(&failed_attempt(q, o, message))
}

/// Puts a claimed job back in the queue without counting a failure.
pub(crate) fn requeue(o: &StoreParams, id: i64, token: i64, span: Option<&str>) -> Statement {
    let c = &o.columns;
    let mut q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Queued))
        .value(alias(&c.worker_hostname), "")
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .value(alias(&c.process_after), Expr::cust("NULL"))
        .to_owned();
    record_span(&mut q, o, span);
    Statement::from(&q)
}

/// Puts a claimed job back in the queue, as [`requeue`] does and counting
/// nothing, if its table or queue is paused now: a job claimed ahead before
/// the pause, about to start. No row when it is not paused (or no longer
/// this claim's); `None` for a store that consults no pause table.
pub(crate) fn requeue_if_paused(o: &StoreParams, id: i64, token: i64) -> Option<Statement> {
    let not_paused = crate::sql::control::not_paused(o, &o.table.alias)?;
    let c = &o.columns;
    let q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Queued))
        .value(alias(&c.worker_hostname), "")
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .and_where(not_paused.not())
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(&o.table.alias),
            quote(&c.id)
        ))))
        .to_owned();
    Some(Statement::from(&q))
}

/// Puts a snoozed job back in the queue, eligible `delay` from now (the
/// database clock), its failures and resets untouched; canceled instead if a
/// cancel was requested meanwhile.
pub(crate) fn snooze(
    o: &StoreParams,
    id: i64,
    token: i64,
    delay: std::time::Duration,
    span: Option<&str>,
) -> Statement {
    let run_at = Expr::cust_with_values("now() + make_interval(secs => $1)", [delay.as_secs_f64()]);
    let mut q = back_to_queue(o, id, token, run_at);
    record_span(&mut q, o, span);
    Statement::from(&q)
}

/// A claimed job's fenced return to `queued`, to run at `run_at`, without
/// counting a failure or a reset (a snooze, a wait); `canceled` instead, its
/// run time kept, if a cancel was requested meanwhile.
pub(crate) fn back_to_queue(o: &StoreParams, id: i64, token: i64, run_at: Expr) -> UpdateStatement {
    let c = &o.columns;
    let a = &o.table.alias;
    let canceled = col(a, &c.cancel).eq(true);
    fenced_update(o, id, token)
        .value(
            alias(&c.state),
            Expr::case(canceled.clone(), state(JobState::Canceled))
                .finally(state(JobState::Queued)),
        )
        .value(alias(&c.worker_hostname), "")
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .value(
            alias(&c.process_after),
            Expr::case(canceled, col(a, &c.process_after)).finally(run_at),
        )
        .to_owned()
}

/// Puts back a claimed job whose transaction connection was lost (a Postgres
/// restart, a terminated backend): not the handler's fault, so `num_failures` is
/// untouched. It counts as a reset, as if the resetter had found it: `queued`
/// with `num_resets + 1`, or `failed` with `message` once it was reset
/// `max_num_resets` times, so a job that keeps killing its connection still ends.
pub(crate) fn requeue_lost(
    o: &StoreParams,
    id: i64,
    token: i64,
    (message, why): (&str, &str),
    span: Option<&str>,
) -> Statement {
    let c = &o.columns;
    let a = &o.table.alias;
    let can_requeue = || counter(a, &c.num_resets).lt(o.max_num_resets);
    let mut q = fenced_update(o, id, token);
    let note = format!("requeued: {why}");
    let history = o.error_history.as_ref().map(|h| (h, note.as_str()));
    reset_or_fail(&mut q, a, c, o.max_num_resets, message, history);
    record_span(&mut q, o, span);
    let q = q
        .value(
            alias(&c.process_after),
            Expr::case(can_requeue(), Expr::cust("NULL")).finally(col(a, &c.process_after)),
        )
        .value(alias(&c.last_heartbeat_at), Expr::cust("NULL"))
        .value(alias(&c.worker_hostname), "")
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::text AS \"state\"",
            quote(a),
            quote(&c.state)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// [`mark_complete`], plus `result_column = result`: the result commits
/// exactly when the completion does (in the handler's transaction, in
/// transactional handling), and a stale attempt writes neither.
pub(crate) fn mark_complete_with_result(
    o: &StoreParams,
    id: i64,
    token: i64,
    (result_column, result): (&str, serde_json::Value),
    span: Option<&str>,
) -> Statement {
    let c = &o.columns;
    let mut q = fenced_update(o, id, token)
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .value(alias(result_column), Expr::val(result))
        .to_owned();
    drop_checkpoint(&mut q, o);
    record_span(&mut q, o, span);
    super::progress_table::completion(q, o)
}

/// [`mark_errored`], plus `payload_column = payload`: a batch job's retry
/// keeps only its failed items. One statement, so the payload changes exactly
/// when the mark lands (the same fence, the same transaction); a stale attempt
/// matches no row and rewrites nothing. The payload is rewritten whichever
/// state the mark writes (errored, failed once retries are exhausted, or
/// canceled): it always holds what was left undone.
pub(crate) fn mark_errored_with_payload(
    o: &StoreParams,
    id: i64,
    token: i64,
    message: &str,
    retry: &RetryRule,
    (payload_column, payload): (&str, serde_json::Value),
    span: Option<&str>,
) -> Statement {
    let mut q = errored_update(o, id, token, message, retry)
        .value(alias(payload_column), Expr::val(payload))
        .to_owned();
    record_span(&mut q, o, span);
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use super::fixtures::{paused, resolved, with_history, with_results, with_traces};
    let (t, r, h) = (resolved(false), with_results(), with_history());
    let span = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (rule, items) = (t.retry_rule(None), serde_json::json!([1, 2]));
    let if_paused = requeue_if_paused(&paused(), 1, 2).expect("a pause table");
    const LOST: &str = "the job's database connection was lost";
    vec![
        ("requeue_if_paused", if_paused),
        ("mark_complete", mark_complete(&t, 1, 2, None)),
        (
            "mark_complete_with_traces",
            mark_complete(&with_traces(), 1, 2, Some(span)),
        ),
        ("mark_errored", mark_errored(&t, 1, 2, "m", &rule, None)),
        (
            "mark_errored_with_traces",
            mark_errored(&with_traces(), 1, 2, "m", &rule, Some(span)),
        ),
        ("mark_failed", mark_failed(&t, 1, 2, "m", None)),
        (
            "mark_failed_with_traces",
            mark_failed(&with_traces(), 1, 2, "m", Some(span)),
        ),
        ("mark_canceled", mark_canceled(&t, 1, 2, "m", None)),
        (
            "mark_canceled_with_traces",
            mark_canceled(&with_traces(), 1, 2, "m", Some(span)),
        ),
        (
            "snooze",
            snooze(&t, 1, 2, std::time::Duration::from_millis(1500), None),
        ),
        (
            "mark_errored_with_payload",
            mark_errored_with_payload(&t, 1, 2, "m", &rule, ("payload", items), None),
        ),
        ("requeue", requeue(&t, 1, 2, None)),
        (
            "requeue_with_traces",
            requeue(&with_traces(), 1, 2, Some(span)),
        ),
        (
            "mark_complete_with_result",
            mark_complete_with_result(&r, 1, 2, ("result", serde_json::json!({"n": 1})), None),
        ),
        ("requeue_lost", requeue_lost(&t, 1, 2, ("m", LOST), None)),
        (
            "requeue_lost_with_traces",
            requeue_lost(&with_traces(), 1, 2, ("m", LOST), Some(span)),
        ),
        (
            "mark_errored_with_history",
            mark_errored(&h, 1, 2, "m", &h.retry_rule(None), None),
        ),
        ("mark_failed_with_history", mark_failed(&h, 1, 2, "m", None)),
        (
            "requeue_lost_with_history",
            requeue_lost(&h, 1, 2, ("m", LOST), None),
        ),
    ]
}
