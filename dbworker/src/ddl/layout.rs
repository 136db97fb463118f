//! The HOT layout's DDL (issue 38): what turns a job table's claim into a
//! HOT update.
//!
//! An update is HOT (a new row version on the same page, no new index
//! entry) only when no column an index reads, in its key or its predicate,
//! changes value, and the page has room. The standard layout's two partial
//! indexes read the state, which both of a job's updates change. The HOT
//! layout replaces them with one index over a generated column that is true
//! while the job is queued, errored or processing: the claim leaves it
//! true, so it is HOT; the completion still is not (the row leaves the
//! index). Measured: `docs/benchmarks.md`, "The HOT layout".

use std::collections::HashMap;

use crate::columns::{Columns, LIVE, Relation, quote};
use crate::error::{Error, Result};

use super::OptionalColumns;

/// How full `INSERT`s leave each page: the rest is room for the claims' HOT
/// row versions. 60 left most claims without room in the experiment
/// (`bench/experiments/hot-updates`); 30 made every claim HOT.
pub const HOT_FILLFACTOR: u32 = 30;

/// The statements that give a job table made by
/// [`job_table_sql`](super::job_table_sql) (and
/// [`optional_columns_sql`](super::optional_columns_sql) with `columns`) the
/// HOT layout: the generated column `dbworker_live`, its index, the room on
/// each page, and the state-reading indexes dropped. Print them after the
/// others; running everything again leaves the same layout. Stores find the
/// layout at start-up and name the column in their claims, so the layout
/// needs no setting. `ADD COLUMN` rewrites the table under an exclusive
/// lock, at the new fill factor.
///
/// Job keys are refused: their unique index reads the state, so every claim
/// would stay a non-HOT update (`dbworker migration` also refuses fair
/// claims and partitioned tables, which this function cannot see). The
/// retention index is rewritten over `finished_at IS NOT NULL` and the
/// priority index over `dbworker_live`.
///
/// ```
/// let ddl = dbworker::ddl::hot_layout_sql("jobs", &Default::default(), Default::default()).unwrap();
/// assert!(ddl.contains(r#"ADD COLUMN IF NOT EXISTS "dbworker_live" boolean GENERATED ALWAYS"#));
/// assert!(ddl.contains(r#"DROP INDEX IF EXISTS "jobs_dequeue_idx""#));
/// ```
pub fn hot_layout_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    columns: OptionalColumns,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    if columns.keys {
        return Err(refused("job keys (their unique index reads the state)"));
    }
    let table = rel.quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    // DROP INDEX names its index in the table's schema, not the search path's.
    let dropped = |suffix: &str| rel.quoted_derived_sibling(suffix);
    let (id, state, live) = (quote(&c.id), quote(&c.state), quote(LIVE));
    let mut ddl = format!(
        r#"-- The HOT layout: claims become HOT updates (see dbworker::ddl::hot_layout_sql).
-- Room on every page first, so the rewrite below leaves it.
ALTER TABLE {table} SET (fillfactor = {HOT_FILLFACTOR});
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {live} boolean GENERATED ALWAYS AS ({state} IN ('queued', 'errored', 'processing')) STORED;
-- The claim, its probe and the resetter read live rows through this index.
CREATE INDEX IF NOT EXISTS {live_idx} ON {table} ({id}) WHERE {live};
DROP INDEX IF EXISTS {dequeue_idx}, {processing_idx};
"#,
        live_idx = index("live_idx"),
        dequeue_idx = dropped("dequeue_idx"),
        processing_idx = dropped("processing_idx"),
    );
    if columns.priority {
        ddl.push_str(&format!(
            r#"CREATE INDEX IF NOT EXISTS {live_priority_idx} ON {table} ("priority" DESC, {id}) WHERE {live};
DROP INDEX IF EXISTS {priority_idx};
"#,
            live_priority_idx = index("live_priority_idx"),
            priority_idx = dropped("priority_dequeue_idx"),
        ));
    }
    if columns.retention {
        ddl.push_str(&format!(
            r#"-- The purger's index, over a column the claim leaves alone.
CREATE INDEX IF NOT EXISTS {done_finished_idx} ON {table} ({finished_at}) WHERE {finished_at} IS NOT NULL;
DROP INDEX IF EXISTS {finished_idx};
"#,
            done_finished_idx = index("done_finished_idx"),
            finished_idx = dropped("finished_idx"),
            finished_at = quote(&c.finished_at),
        ));
    }
    Ok(ddl)
}

fn refused(what: &str) -> Error {
    Error::InvalidOption {
        field: "hot_layout",
        reason: format!("the HOT layout does not support {what} yet"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renamed_columns_and_optional_indexes_are_rewritten_over_the_live_column() {
        let renames = HashMap::from([("state".to_owned(), "status".to_owned())]);
        let mut columns = OptionalColumns {
            priority: true,
            retention: true,
            ..Default::default()
        };
        let ddl = hot_layout_sql("app.jobs", &renames, columns).unwrap();
        assert!(ddl.contains(r#"AS ("status" IN ('queued', 'errored', 'processing')) STORED"#));
        assert!(ddl.contains(r#"ON "app"."jobs" ("priority" DESC, "id") WHERE "dbworker_live""#));
        assert!(ddl.contains(r#"DROP INDEX IF EXISTS "app"."jobs_priority_dequeue_idx""#));
        assert!(ddl.contains(r#"DROP INDEX IF EXISTS "app"."jobs_finished_idx""#));
        assert!(
            !ddl.contains(r#"WHERE "status""#),
            "no index may read the state"
        );
        columns.keys = true;
        let err = hot_layout_sql("jobs", &HashMap::new(), columns).unwrap_err();
        assert!(err.to_string().contains("job keys"), "{err}");
    }
}
