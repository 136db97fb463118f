//! Operators' queries: status, lists and pages by filter, and bulk actions.

use super::admin_filter::filter_conditions;
use super::schema::regclass;
use super::{Statement, Table, alias, col, state, table_ref};
use crate::columns::{CHECKPOINT, quote};
use crate::job_filter::{BulkAction, JobFilter, JobSort, PageRequest, Reschedule};
use crate::message::sanitize_failure_message;
use crate::sql::enqueue::{RunAt, run_at_expr};
use crate::sql::workflow::back_to_waiting;
use sea_query::{Expr, ExprTrait, Order, Query, SelectStatement, UpdateStatement};
use workerutil::JobState;

/// Processing jobs per worker host.
pub(crate) fn admin_hosts(a: &Table) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let q = Query::select()
        .expr_as(
            Expr::cust(format!(
                "{}.{}::text",
                quote(&t.alias),
                quote(&c.worker_hostname)
            )),
            alias("host"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(col(&t.alias, &c.state).eq(state(JobState::Processing)))
        .group_by_col(alias("host"))
        .order_by(alias("host"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The planner's estimate of the table's rows, summed over its leaf
/// partitions: a partitioned parent is never analyzed by autovacuum (its own
/// `reltuples` stays -1), and a plain table is its own only leaf. A leaf
/// never analyzed (-1) counts 0.
pub(crate) fn admin_estimate(a: &Table) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust("COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint"),
            alias("rows"),
        )
        .from_function(
            sea_query::Func::cust(alias("pg_partition_tree")).arg(regclass(&a.table)),
            alias("p"),
        )
        .inner_join(
            sea_query::TableRef::from((alias("pg_catalog"), alias("pg_class"))).alias(alias("c")),
            Expr::cust("c.oid = p.relid"),
        )
        .and_where(Expr::cust("p.isleaf"))
        .to_owned();
    Statement::from(&q)
}

/// One job's row as JSON, and the database clock's `now` (seconds since
/// the epoch), which the dashboard's relative times count from.
pub(crate) fn admin_show(a: &Table, id: i64) -> Statement {
    let t = &a.table;
    let mut q = Query::select();
    // A table that keeps progress in its side table shows it as the
    // columns would be shown: the same keys whichever holds them.
    let row = match &a.progress_table {
        Some(side) => {
            let (joined, on) = super::progress_table::join_side(a, side);
            q.left_join(joined, on);
            format!(
                "to_jsonb({t}) || jsonb_build_object('progress', {s}.\"progress\", 'checkpoint', {s}.\"checkpoint\", 'progress_seq', COALESCE({s}.\"progress_seq\", 0))",
                t = quote(&t.alias),
                s = quote(&side.alias)
            )
        }
        None => format!("to_jsonb({})", quote(&t.alias)),
    };
    let q = q
        .expr_as(Expr::cust(row), alias("row"))
        .expr_as(
            Expr::cust("EXTRACT(EPOCH FROM now())::float8"),
            alias("now"),
        )
        .from(table_ref(t))
        .and_where(col(&t.alias, &a.columns.id).eq(id))
        .to_owned();
    Statement::from(&q)
}

/// The columns a list page shows (no `FROM` yet), of the row aliased as usual.
pub(super) fn list_select(a: &Table) -> SelectStatement {
    let (t, c) = (&a.table, &a.columns);
    let al = &t.alias;
    let text_or_null = |column: &Option<String>| match column {
        Some(column) => Expr::cust(format!("{}.{}::text", quote(al), quote(column))),
        None => Expr::cust("NULL::text"),
    };
    let mut q = Query::select();
    q.expr_as(
        Expr::cust(format!("{}.{}::bigint", quote(al), quote(&c.id))),
        alias("id"),
    )
    .expr_as(
        Expr::cust(format!("{}.{}::text", quote(al), quote(&c.state))),
        alias("state"),
    )
    .expr_as(text_or_null(&a.queue_column), alias("queue"))
    .expr_as(text_or_null(&a.kind_column), alias("kind"))
    .expr_as(
        Expr::cust(format!("{}.{}::integer", quote(al), quote(&c.num_failures))),
        alias("num_failures"),
    )
    .expr_as(
        Expr::cust(format!(
            "COALESCE(EXTRACT(EPOCH FROM now() - {}.{}), 0)::float8",
            quote(al),
            quote(&c.queued_at)
        )),
        alias("age"),
    )
    .expr_as(
        Expr::cust(format!(
            "COALESCE({}.{}::text, '')",
            quote(al),
            quote(&c.worker_hostname)
        )),
        alias("host"),
    )
    .expr_as(
        Expr::cust(format!("{}.{}::text", quote(al), quote(&c.failure_message))),
        alias("failure_message"),
    )
    .expr_as(
        if a.workflows {
            Expr::cust(format!(
                "{}.{}::bigint",
                quote(al),
                quote(crate::columns::WORKFLOW_ID)
            ))
        } else {
            Expr::cust("NULL::bigint")
        },
        alias("workflow_id"),
    );
    q
}

/// A page of jobs matching a filter, by id (keyset).
pub(crate) fn admin_list(a: &Table, f: &JobFilter, page: &PageRequest) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let al = &t.alias;
    let mut q = list_select(a);
    q.from(table_ref(t));
    for cond in filter_conditions(a, f) {
        q.and_where(cond);
    }
    let order = if page.newest_first {
        Order::Desc
    } else {
        Order::Asc
    };
    let cmp = if page.newest_first { "<" } else { ">" };
    let id = format!("{}.{}", quote(al), quote(&c.id));
    match list_sort(a, page.sort) {
        None => {
            if let Some(after) = page.after {
                q.and_where(Expr::cust_with_values(format!("{id} {cmp} $1"), [after]));
            }
            q.expr_as(Expr::cust("NULL::text"), alias("sort_value"));
        }
        Some((key, ty)) => {
            if let (Some(after), Some(value)) = (page.after, &page.after_value) {
                q.and_where(Expr::cust_with_values(
                    format!("({key}, {id}) {cmp} ($1::{ty}, $2)"),
                    [
                        sea_query::Value::from(value.clone()),
                        sea_query::Value::from(after),
                    ],
                ));
            }
            q.expr_as(Expr::cust(format!("({key})::text")), alias("sort_value"))
                .order_by_expr(Expr::cust(key), order.clone());
        }
    }
    q.order_by_expr(Expr::cust(id), order)
        .limit(u64::from(page.size));
    Statement::from(&q)
}

/// A list sort's expression (NULLs folded so row comparison works) and its
/// SQL type; `None` for the id.
pub(super) fn list_sort(a: &Table, sort: JobSort) -> Option<(String, &'static str)> {
    let (al, c) = (quote(&a.table.alias), &a.columns);
    let ts = |column: &str| format!("COALESCE({al}.{}, '-infinity'::timestamptz)", quote(column));
    match sort {
        JobSort::QueuedAt => Some((ts(&c.queued_at), "timestamptz")),
        JobSort::FinishedAt => Some((ts(&c.finished_at), "timestamptz")),
        JobSort::Failures => Some((
            format!("COALESCE({al}.{}, 0)::integer", quote(&c.num_failures)),
            "integer",
        )),
        _ => None,
    }
}

/// The filter narrowed to the states an action may touch.
pub(super) fn filter_for(f: &JobFilter, states: &[JobState]) -> JobFilter {
    let mut f = f.clone();
    f.states = if f.states.is_empty() {
        states.to_vec()
    } else {
        f.states
            .into_iter()
            .filter(|s| states.contains(s))
            .collect()
    };
    f
}

/// The next batch of ids a bulk action selects, after `after` (keyset by id,
/// so a batch whose jobs changed is never selected again).
pub(crate) fn admin_select_ids(
    a: &Table,
    f: &JobFilter,
    states: &[JobState],
    after: i64,
    size: u32,
) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let f = filter_for(f, states);
    let mut q = Query::select();
    q.expr_as(
        Expr::cust(format!("{}.{}::bigint", quote(&t.alias), quote(&c.id))),
        alias("id"),
    )
    .from(table_ref(t))
    .and_where(col(&t.alias, &c.id).gt(after));
    // No state left: the filter names only states the action may not touch.
    if f.states.is_empty() {
        q.and_where(Expr::cust("false"));
    }
    for cond in filter_conditions(a, &f) {
        q.and_where(cond);
    }
    q.order_by((alias(&t.alias), alias(&c.id)), Order::Asc)
        .limit(u64::from(size));
    Statement::from(&q)
}

/// How many jobs a bulk action would select, and the highest id among them
/// (its bound once the operator confirms).
pub(crate) fn admin_count(a: &Table, f: &JobFilter, states: &[JobState]) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let f = filter_for(f, states);
    let mut q = Query::select();
    q.expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .expr_as(
            Expr::cust(format!("max({}.{})::bigint", quote(&t.alias), quote(&c.id))),
            alias("max_id"),
        )
        .from(table_ref(t));
    if f.states.is_empty() {
        q.and_where(Expr::cust("false"));
    }
    for cond in filter_conditions(a, &f) {
        q.and_where(cond);
    }
    Statement::from(&q)
}

/// `UPDATE` of the jobs among `ids` still in one of `states` (checked again
/// on the row itself, so a job that moved on meanwhile is left alone).
pub(super) fn admin_update(a: &Table, ids: &[i64], states: &[JobState]) -> UpdateStatement {
    let t = &a.table;
    Query::update()
        .table(table_ref(t))
        .and_where(ids_in(&t.alias, &a.columns.id, ids))
        .and_where(col(&t.alias, &a.columns.state).is_in(states.iter().map(|s| state(*s))))
        .to_owned()
}

pub(super) fn ids_in(a: &str, id: &str, ids: &[i64]) -> Expr {
    Expr::cust_with_values(
        format!("{}.{} = ANY($1::bigint[])", quote(a), quote(id)),
        [sea_query::Value::from(ids.to_vec())],
    )
}

/// A requeue's or a reschedule's state: `queued`, or on a table with
/// workflows `pending` for a job that still waits for an upstream job.
fn requeued(a: &Table, q: &mut UpdateStatement, ids: &[i64], states: &[JobState]) {
    if a.workflows {
        back_to_waiting(a, q, ids, states);
    } else {
        q.value(alias(&a.columns.state), state(JobState::Queued));
    }
}

/// Finished or errored jobs back to `queued` (or `pending`, see
/// `requeued`), to run now, failures reset.
/// The old attempt's start goes too: a requeued job has not run in its new
/// life, so one canceled before its next claim has no run time (not the
/// days since the old start).
pub(crate) fn admin_requeue(a: &Table, ids: &[i64]) -> Statement {
    let c = &a.columns;
    let mut q = admin_update(a, ids, BulkAction::Requeue.states());
    requeued(a, &mut q, ids, BulkAction::Requeue.states());
    let q = q
        .value(alias(&c.process_after), Expr::cust("NULL"))
        .value(alias(&c.started_at), Expr::cust("NULL"))
        .value(alias(&c.num_failures), 0)
        .value(alias(&c.cancel), false)
        .value(alias(&c.finished_at), Expr::cust("NULL"))
        .to_owned();
    Statement::from(&q)
}

/// Waiting jobs to `canceled`.
///
/// The finishing statements (this one, `admin_fail`, `admin_complete`)
/// stamp `finished_at` with the clock, not the statement's start: one that
/// waited for a transaction writing the row (a heartbeat, an application's
/// update) stamped the time it began, seconds before its write.
pub(crate) fn admin_cancel_waiting(a: &Table, ids: &[i64]) -> Statement {
    let c = &a.columns;
    let q = admin_update(
        a,
        ids,
        &[JobState::Pending, JobState::Queued, JobState::Errored],
    )
    .value(alias(&c.state), state(JobState::Canceled))
    .value(alias(&c.cancel), true)
    .value(alias(&c.failure_message), "canceled by an operator")
    .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
    .to_owned();
    Statement::from(&q)
}

/// Asks processing jobs' workers to cancel them.
pub(crate) fn admin_request_cancel(a: &Table, ids: &[i64]) -> Statement {
    let q = admin_update(a, ids, &[JobState::Processing])
        .value(alias(&a.columns.cancel), true)
        .to_owned();
    Statement::from(&q)
}

/// Waiting jobs to `failed` with `message`.
pub(crate) fn admin_fail(a: &Table, ids: &[i64], message: &str) -> Statement {
    let c = &a.columns;
    let q = admin_update(a, ids, &[JobState::Queued, JobState::Errored])
        .value(alias(&c.state), state(JobState::Failed))
        .value(
            alias(&c.failure_message),
            sanitize_failure_message(message).as_ref(),
        )
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    Statement::from(&q)
}

/// Deletes jobs no worker holds.
pub(crate) fn admin_delete(a: &Table, ids: &[i64]) -> Statement {
    let t = &a.table;
    let c = &a.columns;
    let q = Query::delete()
        .from_table(table_ref(t))
        .and_where(ids_in(&t.alias, &c.id, ids))
        .and_where(col(&t.alias, &c.state).ne(state(JobState::Processing)))
        .to_owned();
    Statement::from(&q)
}

/// Jobs no worker holds (queued, errored, failed, canceled) to `completed`,
/// as a worker's completion leaves them: the checkpoint dropped (in the
/// columns, or the side table's in the same statement), the progress kept.
pub(crate) fn admin_complete(a: &Table, ids: &[i64]) -> Statement {
    let c = &a.columns;
    let mut q = admin_update(a, ids, BulkAction::Complete.states())
        .value(alias(&c.state), state(JobState::Completed))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .to_owned();
    if a.progress {
        q.value(alias(CHECKPOINT), Expr::cust("NULL"));
    }
    super::progress_table::completion(q, a)
}

/// Jobs no worker holds (queued, errored, failed, canceled) back to
/// `queued`, with the scheduling values `r` sets (the others unchanged).
pub(crate) fn admin_reschedule(a: &Table, ids: &[i64], r: &Reschedule) -> Statement {
    let c = &a.columns;
    let states = BulkAction::Reschedule(r.clone()).states();
    let mut q = admin_update(a, ids, states);
    requeued(a, &mut q, ids, states);
    q.value(alias(&c.finished_at), Expr::cust("NULL"))
        .value(alias(&c.cancel), false);
    let run_at = match (r.run_after, r.run_at) {
        (Some(delay), _) => Some(RunAt::After(delay)),
        (None, Some(at)) => Some(RunAt::At(at)),
        (None, None) => None,
    };
    if let Some(run_at) = run_at {
        q.value(alias(&c.process_after), run_at_expr(run_at));
    }
    if let Some(n) = r.num_failures {
        q.value(alias(&c.num_failures), n);
    }
    if let (Some(column), Some(p)) = (&a.priority_column, r.priority) {
        q.value(alias(column), p);
    }
    if let (Some(column), Some(m)) = (&a.max_retries_column, r.max_retries) {
        q.value(alias(column), m);
    }
    Statement::from(&q)
}

/// Deletes the waiting (queued or errored) job holding `key`; returns its id.
pub(crate) fn admin_remove_key(a: &Table, key: &str) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let key_column = a.key_column.clone().unwrap_or_default();
    let q = Query::delete()
        .from_table(table_ref(t))
        .and_where(col(&t.alias, &key_column).eq(key))
        .and_where(
            col(&t.alias, &c.state).is_in([state(JobState::Queued), state(JobState::Errored)]),
        )
        .returning(Query::returning().expr(Expr::cust(format!(
            "{}.{}::bigint AS \"id\"",
            quote(&t.alias),
            quote(&c.id)
        ))))
        .to_owned();
    Statement::from(&q)
}

/// Jobs that finished (completed, failed, canceled) in the last `window`, per
/// state: a throughput sample for `dbworker top`. The states are exactly the
/// predicate of the retention index (`dbworker migration --retention`), so
/// the planner can use it.
pub(crate) fn admin_recent(a: &Table, window: std::time::Duration) -> Statement {
    let (t, c) = (&a.table, &a.columns);
    let al = quote(&t.alias);
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("{al}.{}::text", quote(&c.state))),
            alias("state"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(Expr::cust_with_values(
            format!(
                "{al}.{} >= now() - $1 * interval '1 second'",
                quote(&c.finished_at)
            ),
            [window.as_secs_f64()],
        ))
        .and_where(
            col(&t.alias, &c.state).is_in(
                [JobState::Completed, JobState::Failed, JobState::Canceled]
                    .into_iter()
                    .map(state),
            ),
        )
        .add_group_by([Expr::cust("1")])
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    use crate::job_filter::FieldFilter;
    use std::time::Duration;
    let a = super::fixtures::admin_table();
    let filter = JobFilter {
        states: vec![JobState::Failed],
        queue: Some("emails".into()),
        kind: Some("send".into()),
        older_than: Some(Duration::from_secs(60)),
        newer_than: Some(Duration::from_secs(3600)),
        failure_contains: Some("timeout".into()),
        fields: vec![FieldFilter::new("payload", &["to", "domain"], "example.com").unwrap()],
        workflow_id: None,
        stalled_after: None,
        max_id: Some(1000),
    };
    let workflows = Table {
        workflows: true,
        ..a.clone()
    };
    let of_workflow = JobFilter {
        workflow_id: Some(7),
        ..JobFilter::default()
    };
    let by_failures = PageRequest {
        after: Some(10),
        after_value: Some("3".into()),
        newest_first: true,
        sort: JobSort::Failures,
        ..PageRequest::first(50)
    };
    let reschedule = Reschedule {
        run_after: Some(Duration::from_secs(60)),
        priority: Some(3),
        num_failures: Some(0),
        max_retries: Some(5),
        ..Default::default()
    };
    let waiting = [JobState::Queued, JobState::Errored];
    let page = PageRequest::first(50);
    vec![
        ("admin_hosts", admin_hosts(&a)),
        ("admin_estimate", admin_estimate(&a)),
        ("admin_show", admin_show(&a, 1)),
        ("admin_show_progress_table", {
            let mut side = a.clone();
            side.progress_table = Some(super::fixtures::rel("app.jobs_progress"));
            admin_show(&side, 1)
        }),
        ("admin_list", admin_list(&a, &filter, &page)),
        (
            "admin_list_by_workflow",
            admin_list(&workflows, &of_workflow, &page),
        ),
        (
            "admin_list_by_failures_newest_first",
            admin_list(&a, &JobFilter::default(), &by_failures),
        ),
        (
            "admin_list_stalled",
            admin_list(
                &a,
                &JobFilter {
                    stalled_after: Some(Duration::from_secs(30)),
                    ..JobFilter::default()
                },
                &page,
            ),
        ),
        (
            "admin_select_ids",
            admin_select_ids(&a, &filter, &waiting, 0, 100),
        ),
        ("admin_count", admin_count(&a, &filter, &waiting)),
        ("admin_requeue", admin_requeue(&a, &[1, 2])),
        (
            "admin_requeue_workflows",
            admin_requeue(&workflows, &[1, 2]),
        ),
        ("admin_cancel_waiting", admin_cancel_waiting(&a, &[1, 2])),
        ("admin_request_cancel", admin_request_cancel(&a, &[1, 2])),
        ("admin_fail", admin_fail(&a, &[1, 2], "m")),
        ("admin_delete", admin_delete(&a, &[1, 2])),
        ("admin_complete", admin_complete(&a, &[1, 2])),
        (
            "admin_complete_side_progress",
            admin_complete(
                &Table {
                    progress_table: Some(super::fixtures::rel("app.example_jobs_progress")),
                    ..super::fixtures::admin_table()
                },
                &[1, 2],
            ),
        ),
        (
            "admin_reschedule",
            admin_reschedule(&a, &[1, 2], &reschedule),
        ),
        (
            "admin_reschedule_state_only",
            admin_reschedule(&a, &[1], &Default::default()),
        ),
        (
            "admin_reschedule_workflows",
            admin_reschedule(&workflows, &[1], &Default::default()),
        ),
        ("admin_remove_key", admin_remove_key(&a, "k")),
        ("admin_recent", admin_recent(&a, Duration::from_secs(300))),
    ]
}
