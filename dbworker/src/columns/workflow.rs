//! The names workflows add to a job table (`dbworker migration --workflows`):
//! fixed, like the other optional columns, and derived from the table's name.

use super::Relation;

/// The job's workflow (`bigint`, NULL for a job outside any workflow).
pub(crate) const WORKFLOW_ID: &str = "workflow_id";
/// The job's task name within its workflow (`text`).
pub(crate) const TASK_NAME: &str = "task_name";
/// The upstream job whose failure canceled this one (`bigint`): set by the
/// release trigger, cleared when that upstream is retried.
pub(crate) const BLOCKED_BY: &str = "blocked_by";

/// The jobs a dependent waited for (`bigint[]`, `dbworker migration
/// --results`): recorded when it is enqueued, so it can read their results
/// after the edges are gone.
pub(crate) const UPSTREAM_IDS: &str = "upstream_ids";

/// Whether any job was ever made to wait for this one (`boolean`): the
/// release trigger fires only for such jobs, so the others' completions cost
/// nothing more than on a table without workflows.
pub(crate) const HAS_DEPENDENTS: &str = "has_dependents";

/// The dependency edges of `table`: `<table>_deps`, in the table's schema.
pub(crate) fn deps_table(table: &Relation) -> Relation {
    Relation {
        schema: table.schema.clone(),
        name: table.derived("deps"),
        alias: "dbworker_dep".to_owned(),
    }
}

/// The sequence workflow ids come from: `<table>_workflow_seq`.
pub(crate) fn workflow_sequence(table: &Relation) -> String {
    table.quoted_derived_sibling("workflow_seq")
}
