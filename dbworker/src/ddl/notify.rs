//! The NOTIFY trigger that wakes listening workers when a job becomes runnable.

use crate::columns::{Columns, Relation, literal, quote};
use crate::error::Result;
use crate::notify::Listen;

/// SQL that makes Postgres announce new work on `channel` (default: the
/// table's [`default_notify_channel`](crate::store::default_notify_channel)): one notification per `INSERT`
/// statement (however many rows it inserts) carrying the lowest id it
/// inserted, and one per row that goes back to `queued` (a requeue, a reset,
/// a workflow's release) carrying the row's id. A listening store whose claim
/// cursor has passed that id takes the cursor back at once, so a job whose
/// insert commits after claims passed its id waits for no probe. Jobs that
/// come due later (retries, scheduled jobs) are not announced: the store's
/// probe finds them and wakes the workers (see `ClaimOptions::claim_cursor`). Needs
/// PostgreSQL 14 or newer (`CREATE OR REPLACE TRIGGER`).
///
/// ```
/// let ddl = dbworker::ddl::notify_trigger_sql("email_jobs", &Default::default(), None).unwrap();
/// assert!(ddl.contains("pg_notify"));
/// ```
pub fn notify_trigger_sql(
    table_name: &str,
    alternate_column_names: &std::collections::HashMap<String, String>,
    channel: Option<&str>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let channel = match channel {
        Some(ch) => Listen::Channel(ch.to_owned()).resolve(&rel)?,
        None => Listen::TableChannel.resolve(&rel)?,
    }
    .unwrap_or_default();
    let table = rel.quoted();
    let on_insert = rel.quoted_derived("dbworker_notify_insert");
    let on_requeue = rel.quoted_derived("dbworker_notify_requeue");
    let state = quote(&c.state);
    let id = quote(&c.id);
    // A function of its own (not the empty-payload `_dbworker_notify` of
    // earlier versions): replacing that one in place would break inserts
    // between the two statements when the DDL runs outside a transaction.
    let insert_function = rel.quoted_derived_sibling("dbworker_notify_insert");
    let row_function = rel.quoted_derived_sibling("dbworker_notify_row");
    // The channel derives from the table's name, which may hold a quote.
    let channel_literal = literal(&channel);
    Ok(format!(
        r#"-- Wakes dbworker listeners on channel '{channel}' when jobs are queued.
-- Each notification carries a job id: a listening store whose claim cursor
-- has passed it takes the cursor back at once.
CREATE OR REPLACE FUNCTION {insert_function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The lowest id the statement inserted; nothing when it inserted none.
    PERFORM pg_notify(TG_ARGV[0], min({id})::text) FROM dbworker_inserted
        HAVING min({id}) IS NOT NULL;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION {row_function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.{id}::text);
    RETURN NULL;
END
$$;
-- One notification per INSERT statement, however many rows it inserts.
CREATE OR REPLACE TRIGGER {on_insert} AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS dbworker_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {insert_function}({channel_literal});
-- One per row that goes back to queued (a requeue, a reset, a release).
CREATE OR REPLACE TRIGGER {on_requeue} AFTER UPDATE OF {state} ON {table}
    FOR EACH ROW WHEN (NEW.{state} = 'queued' AND OLD.{state} IS DISTINCT FROM 'queued')
    EXECUTE FUNCTION {row_function}({channel_literal});
"#
    ))
}

/// A trigger function that NOTIFYs the channel given as its first argument.
pub(crate) fn notify_function_sql(function: &str) -> String {
    format!(
        r#"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_names_stay_within_63_bytes() {
        let ddl = notify_trigger_sql(&"j".repeat(63), &Default::default(), None).unwrap();
        for line in ddl.lines().filter(|l| l.contains("TRIGGER")) {
            let name = line.split('"').nth(1).unwrap();
            assert!(name.len() <= 63, "{name}");
        }
    }

    #[test]
    fn channels_are_checked() {
        assert!(notify_trigger_sql("jobs", &Default::default(), Some("bad name")).is_err());
        let ddl = notify_trigger_sql("jobs", &Default::default(), Some("new_jobs")).unwrap();
        assert!(ddl.contains("('new_jobs')"), "{ddl}");
    }
}
