//! An operator's filter ([`JobFilter`]) as SQL conditions on the job table:
//! shared by the admin's lists, counts and bulk actions and by its bounded
//! search.

use super::{Table, col, state};
use crate::columns::quote;
use crate::job_filter::JobFilter;
use sea_query::{Expr, ExprTrait};
use workerutil::JobState;

/// The conditions of an operator's filter on the table (aliased as usual).
pub(crate) fn filter_conditions(a: &Table, f: &JobFilter) -> Vec<Expr> {
    let (t, c) = (&a.table, &a.columns);
    let al = &t.alias;
    let mut conds = Vec::new();
    if !f.states.is_empty() {
        conds.push(col(al, &c.state).is_in(f.states.iter().map(|s| state(*s))));
    }
    for (column, value) in [(&a.queue_column, &f.queue), (&a.kind_column, &f.kind)] {
        if let (Some(column), Some(value)) = (column, value) {
            conds.push(Expr::cust_with_values(
                format!("{}.{}::text = $1", quote(al), quote(column)),
                [value.clone()],
            ));
        }
    }
    // Queued at least (`<=`) or at most (`>=`) this long ago.
    for (age, cmp) in [(f.older_than, "<="), (f.newer_than, ">=")] {
        if let Some(age) = age {
            conds.push(Expr::cust_with_values(
                format!(
                    "{}.{} {cmp} now() - $1 * interval '1 second'",
                    quote(al),
                    quote(&c.queued_at)
                ),
                [age.as_secs_f64()],
            ));
        }
    }
    if let Some(text) = &f.failure_contains {
        let escaped = text
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        conds.push(Expr::cust_with_values(
            format!("{}.{} ILIKE $1", quote(al), quote(&c.failure_message)),
            [format!("%{escaped}%")],
        ));
    }
    if let Some(max) = f.max_id {
        conds.push(col(al, &c.id).lte(max));
    }
    if let Some(id) = f.workflow_id {
        conds.push(col(al, crate::columns::WORKFLOW_ID).eq(id));
    }
    if let Some(age) = f.stalled_after {
        conds.push(col(al, &c.state).eq(state(JobState::Processing)));
        conds.push(Expr::cust_with_values(
            format!(
                "COALESCE({al}.{heartbeat}, {al}.{started}) < now() - $1 * interval '1 second'",
                al = quote(al),
                heartbeat = quote(&c.last_heartbeat_at),
                started = quote(&c.started_at),
            ),
            [age.as_secs_f64()],
        ));
    }
    for field in &f.fields {
        let target = format!("{}.{}", quote(al), quote(&field.column));
        conds.push(if field.path.is_empty() {
            Expr::cust_with_values(format!("{target}::text = $1"), [field.value.clone()])
        } else {
            Expr::cust_with_values(
                format!("{target} #>> $1::text[] = $2"),
                [
                    sea_query::Value::from(field.path.clone()),
                    sea_query::Value::from(field.value.clone()),
                ],
            )
        });
    }
    conds
}
