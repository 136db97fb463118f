//! Workflows: dependency edges inserted with their jobs, upstream jobs locked
//! while a dependent is added, a workflow canceled, its tasks listed. The
//! release itself is the trigger `ddl::workflows_sql` installs: it runs in the
//! transaction of whatever write finishes a job, so no statement here does it.

use super::{Statement, Table, alias, col, plain_table, state, table_ref};
use crate::columns::{
    BLOCKED_BY, HAS_DEPENDENTS, TASK_NAME, UPSTREAM_IDS, WORKFLOW_ID, deps_table, workflow_sequence,
};
use crate::columns::{Relation, quote};
use crate::message::sanitize_failure_message;
use sea_query::{
    CommonTableExpression, Expr, ExprTrait, LockType, Order, Query, UpdateStatement, WithClause,
};
use workerutil::JobState;

/// The dependency edges' table, aliased `dbworker_dep`.
fn deps(w: &Table) -> Relation {
    deps_table(&w.table)
}

/// A new workflow id from the table's sequence.
pub(crate) fn workflow_next_id(w: &Table) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust_with_values(
                "nextval($1::regclass)::bigint",
                [workflow_sequence(&w.table)],
            ),
            alias("id"),
        )
        .to_owned();
    Statement::from(&q)
}

/// Inserts dependency edges: `job_ids[i]` waits for `upstream[i]` under
/// `policies[i]` (`cancel`, `ignore_failed`, `ignore_canceled`, `ignore`).
pub(crate) fn deps_insert(
    w: &Table,
    job_ids: Vec<i64>,
    upstream: Vec<i64>,
    policies: Vec<String>,
) -> Statement {
    let select = Query::select()
        .expr(Expr::cust_with_values("unnest($1::bigint[])", [job_ids]))
        .expr(Expr::cust_with_values("unnest($1::bigint[])", [upstream]))
        .expr(Expr::cust_with_values("unnest($1::text[])", [policies]))
        .to_owned();
    let q = Query::insert()
        .into_table(plain_table(&deps(w)))
        .columns([alias("job_id"), alias("depends_on"), alias("policy")])
        .select_from(select)
        .expect("three columns, three expressions")
        .to_owned();
    Statement::from(&q)
}

/// Locks the upstream jobs a new dependent will wait for, `FOR SHARE`, and
/// returns their states. The lock conflicts with the update that finishes a
/// job, so none of them finishes between this read and the commit of the new
/// edges: an edge is never inserted behind the completion that should have
/// deleted it.
pub(crate) fn lock_upstreams(w: &Table, ids: Vec<i64>) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("{}.{}::bigint", quote(a), quote(&c.id))),
            alias("id"),
        )
        .expr_as(
            Expr::cust(format!("{}.{}::text", quote(a), quote(&c.state))),
            alias("state"),
        )
        .from(table_ref(t))
        .and_where(Expr::cust_with_values(
            format!("{}.{} = ANY($1::bigint[])", quote(a), quote(&c.id)),
            [ids],
        ))
        .order_by_expr(col(a, &c.id), Order::Asc)
        .lock(LockType::Share)
        .to_owned();
    Statement::from(&q)
}

/// Marks the upstream jobs of a new dependent as waited for, so their final
/// write fires the release trigger. Runs before the edges are inserted, in
/// their transaction, on rows `lock_upstreams` holds: a mark of one of them
/// waits for this commit and then sees the flag.
pub(crate) fn mark_has_dependents(w: &Table, ids: Vec<i64>) -> Statement {
    let t = &w.table;
    let a = &t.alias;
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(HAS_DEPENDENTS), true)
        .and_where(Expr::cust_with_values(
            format!("{}.{} = ANY($1::bigint[])", quote(a), quote(&w.columns.id)),
            [ids],
        ))
        .and_where(col(a, HAS_DEPENDENTS).not())
        .to_owned();
    Statement::from(&q)
}

/// Cancels a new dependent at once: one of its upstream jobs already failed
/// (or was canceled) under a policy that cancels. `blocked_by` names it, so
/// a retry of that job brings this one back to `pending`.
/// `finished_at` is the clock's, not the transaction's start: the enqueue
/// may be in a caller's transaction begun long before.
pub(crate) fn cancel_blocked(w: &Table, id: i64, upstream: i64, message: &str) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(&c.state), state(JobState::Canceled))
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .value(alias(BLOCKED_BY), upstream)
        .value(
            alias(&c.failure_message),
            sanitize_failure_message(message).as_ref(),
        )
        .and_where(col(a, &c.id).eq(id))
        .and_where(col(a, &c.state).eq(state(JobState::Pending)))
        .to_owned();
    Statement::from(&q)
}

/// What an operator's requeue or reschedule (`q`, of the jobs among `ids`
/// in `states`) sets on a table with workflows. A job that still waits for
/// an upstream job (an edge to a row that exists: one not yet completed, or
/// failed and not retried) goes back to `pending`, not `queued`: it must
/// not start before that job completes, and the release queues it then.
/// Its edges to deleted jobs go (a delete takes its edges, but a failed job
/// deleted by an earlier version left them: it never completes, and its edge
/// would hold the dependent for good), and so does `blocked_by`: the job
/// waits for its upstream again, which a failure would cancel anew.
pub(super) fn back_to_waiting(
    w: &Table,
    q: &mut UpdateStatement,
    ids: &[i64],
    states: &[JobState],
) {
    let (t, c) = (&w.table, &w.columns);
    let (edge, up, j) = ("dbworker_e", "dbworker_u", "dbworker_j");
    // An edge to an upstream row that exists: the deletes below are not
    // visible to this statement, so it skips the dangling ones itself.
    let waits = Query::select()
        .expr(Expr::cust("1"))
        .from_as(plain_table(&deps(w)), alias(edge))
        .inner_join(
            plain_table(t).alias(alias(up)),
            col(up, &c.id).equals((alias(edge), alias("depends_on"))),
        )
        .and_where(col(edge, "job_id").equals((alias(&t.alias), alias(&c.id))))
        .to_owned();
    // Only the edges of jobs this action moves: one it leaves alone keeps them.
    let acted_on = Query::select()
        .expr(Expr::cust("1"))
        .from(plain_table(t).alias(alias(j)))
        .and_where(col(j, &c.id).equals((alias(edge), alias("job_id"))))
        .and_where(col(j, &c.state).is_in(states.iter().map(|s| state(*s))))
        .to_owned();
    let upstream_exists = Query::select()
        .expr(Expr::cust("1"))
        .from(plain_table(t).alias(alias(up)))
        .and_where(col(up, &c.id).equals((alias(edge), alias("depends_on"))))
        .to_owned();
    let dangling = Query::delete()
        .from_table(plain_table(&deps(w)).alias(alias(edge)))
        .and_where(Expr::cust_with_values(
            format!("{}.\"job_id\" = ANY($1::bigint[])", quote(edge)),
            [ids.to_vec()],
        ))
        .and_where(Expr::exists(acted_on))
        .and_where(Expr::exists(upstream_exists).not())
        .to_owned();
    q.value(
        alias(&c.state),
        Expr::case(Expr::exists(waits), state(JobState::Pending)).finally(state(JobState::Queued)),
    )
    .value(alias(BLOCKED_BY), Expr::cust("NULL"))
    .with_cte(
        WithClause::new()
            .cte(
                CommonTableExpression::new()
                    .query(dangling)
                    .table_name(alias("dbworker_dangling"))
                    .to_owned(),
            )
            .to_owned(),
    );
}

/// Locks `FOR SHARE`, in id order, the upstream jobs that the jobs among
/// `ids` in `states` still have edges to: run before a requeue or a
/// reschedule, in its transaction, so none of them finishes until it
/// commits. Else a completion racing it deletes the edge and finds the job
/// not yet `pending` to release, while the requeue, still seeing the edge,
/// leaves it `pending` with nothing left to release it.
pub(crate) fn lock_waited_for(w: &Table, ids: &[i64], states: &[JobState]) -> Statement {
    let (t, c) = (&w.table, &w.columns);
    let (edge, up, j) = ("dbworker_e", "dbworker_u", "dbworker_j");
    let waited_for = Query::select()
        .column((alias(edge), alias("depends_on")))
        .from_as(plain_table(&deps(w)), alias(edge))
        .inner_join(
            plain_table(t).alias(alias(j)),
            col(j, &c.id).equals((alias(edge), alias("job_id"))),
        )
        .and_where(Expr::cust_with_values(
            format!("{}.\"job_id\" = ANY($1::bigint[])", quote(edge)),
            [ids.to_vec()],
        ))
        .and_where(col(j, &c.state).is_in(states.iter().map(|s| state(*s))))
        .to_owned();
    let q = Query::select()
        .expr(Expr::cust("1"))
        .from(plain_table(t).alias(alias(up)))
        .and_where(col(up, &c.id).in_subquery(waited_for))
        .order_by((alias(up), alias(&c.id)), Order::Asc)
        .lock(LockType::Share)
        .to_owned();
    Statement::from(&q)
}

/// Cancels the waiting tasks of a workflow (pending, queued, errored). Their
/// dependents outside it follow through the release trigger. `blocked_by` is
/// cleared: a canceled workflow stays canceled when an upstream is retried.
/// `finished_at` is the clock's: the cancel may wait for a transaction
/// writing a task's row, and `now()` would stamp its start.
pub(crate) fn workflow_cancel_waiting(w: &Table, workflow_id: i64) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(&c.state), state(JobState::Canceled))
        .value(alias(&c.cancel), true)
        .value(alias(&c.failure_message), "workflow canceled")
        .value(alias(&c.finished_at), Expr::cust("clock_timestamp()"))
        .value(alias(BLOCKED_BY), Expr::cust("NULL"))
        .and_where(col(a, WORKFLOW_ID).eq(workflow_id))
        .and_where(col(a, &c.state).is_in([
            state(JobState::Pending),
            state(JobState::Queued),
            state(JobState::Errored),
        ]))
        .to_owned();
    Statement::from(&q)
}

/// Asks the workers running a workflow's tasks to cancel them.
pub(crate) fn workflow_request_cancel(w: &Table, workflow_id: i64) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let q = Query::update()
        .table(table_ref(t))
        .value(alias(&c.cancel), true)
        .and_where(col(a, WORKFLOW_ID).eq(workflow_id))
        .and_where(col(a, &c.state).eq(state(JobState::Processing)))
        .to_owned();
    Statement::from(&q)
}

/// A workflow's tasks in id order: id, task name, state, start and finish
/// (database clock, seconds since the epoch), the upstream whose failure canceled it, and the ids of
/// the upstream jobs it still waits for. The last is an `ARRAY(subquery)`,
/// which sea-query cannot build: raw text over quoted names.
pub(crate) fn workflow_tasks(w: &Table, workflow_id: i64) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let d = deps(w);
    let text = |name: &str, ty: &str| Expr::cust(format!("{}.{}::{ty}", quote(a), quote(name)));
    let epoch = |name: &str| {
        Expr::cust(format!(
            "EXTRACT(EPOCH FROM {}.{})::float8",
            quote(a),
            quote(name)
        ))
    };
    let q = Query::select()
        .expr_as(text(&c.id, "bigint"), alias("id"))
        .expr_as(text(TASK_NAME, "text"), alias("task_name"))
        .expr_as(text(&c.state, "text"), alias("state"))
        .expr_as(epoch(&c.started_at), alias("started_at"))
        .expr_as(epoch(&c.finished_at), alias("finished_at"))
        .expr_as(text(BLOCKED_BY, "bigint"), alias("blocked_by"))
        .expr_as(
            Expr::cust(format!(
                "ARRAY(SELECT {da}.\"depends_on\" FROM {deps} AS {da} WHERE {da}.\"job_id\" = {a}.{id} ORDER BY 1)",
                da = quote(&d.alias),
                deps = d.quoted(),
                a = quote(a),
                id = quote(&c.id),
            )),
            alias("waits_on"),
        )
        .from(table_ref(t))
        .and_where(col(a, WORKFLOW_ID).eq(workflow_id))
        .order_by_expr(col(a, &c.id), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The names a batch's callback tasks have; every other task of a batch is
/// one of its jobs.
pub(crate) const BATCH_CALLBACKS: [&str; 3] = ["on_success", "on_failure", "on_complete"];

/// A batch's jobs (its workflow's tasks but the callbacks) counted per state.
pub(crate) fn batch_counts(w: &Table, batch_id: i64) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("{}.{}::text", quote(a), quote(&c.state))),
            alias("state"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(col(a, WORKFLOW_ID).eq(batch_id))
        .and_where(col(a, TASK_NAME).is_not_in(BATCH_CALLBACKS))
        .add_group_by([Expr::cust("1")])
        .to_owned();
    Statement::from(&q)
}

/// A workflow's tasks counted per state (the dashboard's counts, exact
/// however many tasks the drawing shows).
pub(crate) fn workflow_counts(w: &Table, workflow_id: i64) -> Statement {
    let t = &w.table;
    let a = &t.alias;
    let q = Query::select()
        .expr_as(
            Expr::cust(format!("{}.{}::text", quote(a), quote(&w.columns.state))),
            alias("state"),
        )
        .expr_as(Expr::cust("count(*)::bigint"), alias("count"))
        .from(table_ref(t))
        .and_where(col(a, WORKFLOW_ID).eq(workflow_id))
        .add_group_by([Expr::cust("1")])
        .order_by_expr(Expr::cust("1"), Order::Asc)
        .to_owned();
    Statement::from(&q)
}

/// The first `limit` tasks of a workflow, in id order, each with every
/// upstream job it waits or waited for: the edges still there (not yet
/// satisfied) together with `upstream_ids` (recorded at enqueue, kept after
/// the edges go) when `recorded` says the table has that column; without
/// it, the edges alone. The arrays are `ARRAY(subquery … UNION …)`, which
/// sea-query cannot build: raw text over quoted names.
pub(crate) fn workflow_graph(w: &Table, workflow_id: i64, recorded: bool, limit: u64) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = &t.alias;
    let d = deps(w);
    let text = |name: &str, ty: &str| Expr::cust(format!("{}.{}::{ty}", quote(a), quote(name)));
    let edges = format!(
        "SELECT {da}.\"depends_on\" FROM {deps} AS {da} WHERE {da}.\"job_id\" = {a}.{id}",
        da = quote(&d.alias),
        deps = d.quoted(),
        a = quote(a),
        id = quote(&c.id),
    );
    let upstream = if recorded {
        format!(
            "ARRAY({edges} UNION SELECT unnest({}.{}) ORDER BY 1)",
            quote(a),
            quote(UPSTREAM_IDS)
        )
    } else {
        format!("ARRAY({edges} ORDER BY 1)")
    };
    let q = Query::select()
        .expr_as(text(&c.id, "bigint"), alias("id"))
        .expr_as(text(TASK_NAME, "text"), alias("task_name"))
        .expr_as(text(&c.state, "text"), alias("state"))
        .expr_as(Expr::cust(upstream), alias("upstream"))
        .from(table_ref(t))
        .and_where(col(a, WORKFLOW_ID).eq(workflow_id))
        .order_by_expr(col(a, &c.id), Order::Asc)
        .limit(limit)
        .to_owned();
    Statement::from(&q)
}

/// A page of workflows, newest (highest id) first, below the cursor
/// `before`: each with its tasks counted per state (`counts`, a JSON object),
/// its task total, its age (seconds since its first task was queued) and its
/// state (`running` while a task is not final, else `failed` if one failed,
/// `canceled` if one was canceled, else `completed`). `state` filters on it
/// (`finished`: any but `running`; empty: every workflow).
///
/// Never a scan of the job table: the workflow ids are walked down the
/// `workflow_id` index one distinct id at a time (a recursive CTE, each step
/// one index descent), at most `budget` of them, and each one's tasks are
/// read through the same index. The first row carries `scanned` (ids walked)
/// and `last` (the lowest walked), so a filtered page that ran out of budget
/// can continue below it; no matching workflow leaves `id` NULL. Raw text
/// over quoted names: sea-query builds neither the recursive step nor the
/// lateral join.
pub(crate) fn workflow_list(
    w: &Table,
    before: i64,
    budget: u64,
    state: &str,
    page: u64,
) -> Statement {
    let t = &w.table;
    let c = &w.columns;
    let a = quote(&t.alias);
    let table = t.quoted();
    let wf = format!("{a}.{}", quote(WORKFLOW_ID));
    let next_below = |bound: &str| {
        format!(
            "SELECT {wf} FROM {table} AS {a} WHERE {wf} IS NOT NULL AND {wf} < {bound} ORDER BY {wf} DESC LIMIT 1"
        )
    };
    let sql = format!(
        "WITH RECURSIVE \"ids\"(\"id\") AS (({first}) UNION ALL SELECT ({step}) FROM \"ids\" WHERE \"ids\".\"id\" IS NOT NULL), \
         \"scan\" AS (SELECT \"id\" FROM \"ids\" WHERE \"id\" IS NOT NULL LIMIT $2), \
         \"page\" AS (SELECT \"w\".\"id\", \"c\".\"counts\", \"c\".\"total\", \"c\".\"age\", \"c\".\"state\" FROM \"scan\" AS \"w\" CROSS JOIN LATERAL (\
         SELECT jsonb_object_agg(\"s\".\"state\", \"s\".\"n\") AS \"counts\", sum(\"s\".\"n\")::bigint AS \"total\", \
         COALESCE(EXTRACT(EPOCH FROM now() - min(\"s\".\"first\")), 0)::float8 AS \"age\", \
         CASE WHEN bool_or(\"s\".\"state\" NOT IN ('completed', 'failed', 'canceled')) THEN 'running' \
         WHEN bool_or(\"s\".\"state\" = 'failed') THEN 'failed' WHEN bool_or(\"s\".\"state\" = 'canceled') THEN 'canceled' \
         ELSE 'completed' END AS \"state\" \
         FROM (SELECT {a}.{state}::text AS \"state\", count(*)::bigint AS \"n\", min({a}.{queued_at}) AS \"first\" \
         FROM {table} AS {a} WHERE {wf} = \"w\".\"id\" GROUP BY 1) AS \"s\") AS \"c\" \
         WHERE $3::text = '' OR \"c\".\"state\" = $3::text OR ($3::text = 'finished' AND \"c\".\"state\" <> 'running') \
         ORDER BY \"w\".\"id\" DESC LIMIT $4) \
         SELECT \"x\".\"scanned\", \"x\".\"last\", \"p\".\"id\", \"p\".\"counts\", \"p\".\"total\", \"p\".\"age\", \"p\".\"state\" \
         FROM (SELECT count(*)::bigint AS \"scanned\", min(\"id\") AS \"last\" FROM \"scan\") AS \"x\" \
         LEFT JOIN \"page\" AS \"p\" ON true ORDER BY \"p\".\"id\" DESC",
        first = next_below("$1"),
        step = next_below("\"ids\".\"id\""),
        state = quote(&c.state),
        queued_at = quote(&c.queued_at),
    );
    let values = vec![
        sea_query::Value::from(before),
        sea_query::Value::from(i64::try_from(budget).unwrap_or(i64::MAX)),
        sea_query::Value::from(state.to_owned()),
        sea_query::Value::from(i64::try_from(page).unwrap_or(i64::MAX)),
    ];
    Statement {
        sql: sql.into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(values)),
    }
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let w = super::fixtures::workflow_table();
    let on_failure = vec!["cancel".into(), "ignore".into()];
    vec![
        ("workflow_next_id", workflow_next_id(&w)),
        (
            "deps_insert",
            deps_insert(&w, vec![3, 3], vec![1, 2], on_failure),
        ),
        ("lock_upstreams", lock_upstreams(&w, vec![1, 2])),
        (
            "lock_waited_for",
            lock_waited_for(&w, &[1, 2], &[JobState::Failed, JobState::Canceled]),
        ),
        ("mark_has_dependents", mark_has_dependents(&w, vec![1, 2])),
        (
            "cancel_blocked",
            cancel_blocked(&w, 3, 1, "upstream job 1 was failed"),
        ),
        ("workflow_cancel_waiting", workflow_cancel_waiting(&w, 7)),
        ("workflow_request_cancel", workflow_request_cancel(&w, 7)),
        ("workflow_tasks", workflow_tasks(&w, 7)),
        ("batch_counts", batch_counts(&w, 7)),
        ("workflow_counts", workflow_counts(&w, 7)),
        ("workflow_graph", workflow_graph(&w, 7, true, 501)),
        (
            "workflow_graph_from_edges_only",
            workflow_graph(&w, 7, false, 501),
        ),
        (
            "workflow_list",
            workflow_list(&w, i64::MAX, 1000, "failed", 51),
        ),
    ]
}
