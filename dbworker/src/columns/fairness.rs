//! The names fair claims add to a job table (`dbworker migration --fair`):
//! fixed, like the other optional columns, and derived from the table's name.

use super::Relation;

/// The job's fairness key (`text`): the tenant, customer or account whose
/// share it counts against. NULL is one key of its own.
pub(crate) const FAIR_KEY: &str = "fair_key";
/// The job's start tag (`bigint`), set by the table's trigger when the job
/// starts to wait: claims take jobs in tag order within a priority.
pub(crate) const FAIR_TAG: &str = "fair_tag";
/// The job's declared cost (`integer`, default 1): a key's share is counted
/// in cost, not in jobs.
pub(crate) const FAIR_COST: &str = "fair_cost";
/// One key's share is its weight over the sum of the backlogged keys'
/// weights; a job of cost `c` advances its key's tags by `c × TAG_SCALE /
/// weight`, so weights up to [`MAX_FAIR_WEIGHT`] stay exact enough.
pub(crate) const TAG_SCALE: i64 = 1_000_000;
/// The largest cost a job may declare (the column's CHECK; the least is 1).
pub(crate) const MAX_FAIR_COST: u32 = 1_000_000;
/// The largest weight the weight table accepts.
pub(crate) const MAX_FAIR_WEIGHT: u32 = 10_000;

/// The weights of `table`'s keys: `<table>_fair_weights`, in its schema.
pub(crate) fn fair_weights_table(table: &Relation) -> Relation {
    Relation {
        schema: table.schema.clone(),
        name: table.derived("fair_weights"),
        alias: "dbworker_weight".to_owned(),
    }
}

/// The tag of a job that was not due when it started to wait (scheduled, a
/// retry's backoff, a snooze): behind every tagged job of its level, until
/// the store has it tagged once due (2^62: far above any real tag).
pub(crate) const FAIR_UNTAGGED: i64 = 1 << 62;

/// The trigger that tags an untagged job come due, when the store sets its
/// tag to -1. Optional: tables made before it existed have no untagged jobs.
pub(crate) fn fair_due_trigger(table: &Relation) -> String {
    table.derived("fair_tag_due")
}

/// The triggers that tag `table`'s jobs: on insert, and when a job waits again.
pub(crate) fn fair_triggers(table: &Relation) -> [String; 2] {
    [
        table.derived("fair_tag_insert"),
        table.derived("fair_tag_update"),
    ]
}
