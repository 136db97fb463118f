//! Generates the DDL for a new job table: the standard columns (renamed as
//! configured) and the indexes the dequeue and the resetter use.

use std::collections::HashMap;

use crate::columns::{Columns, Relation, bounded_name};
use crate::error::Result;
use crate::sql::quote;

/// Returns `CREATE TABLE` and `CREATE INDEX` statements for a job table named
/// `table_name` (optionally schema-qualified) with the standard columns,
/// renamed by `alternate_column_names`. Add your own columns after generating.
///
/// ```
/// let ddl = dbworker::job_table_sql("email_jobs", &Default::default()).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "email_jobs""#));
/// ```
pub fn job_table_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = match &rel.schema {
        Some(s) => format!("{}.{}", quote(s), quote(&rel.name)),
        None => quote(&rel.name),
    };
    // Postgres truncates names to 63 bytes: long table names would give both
    // indexes one name, and `IF NOT EXISTS` would skip the second.
    let index = |suffix: &str| quote(&bounded_name(&format!("{}_{suffix}", rel.name)));
    let q = |s: &str| quote(s);
    Ok(format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    {id} bigserial PRIMARY KEY,
    {state} text NOT NULL DEFAULT 'queued',
    {failure_message} text,
    {queued_at} timestamptz NOT NULL DEFAULT now(),
    {started_at} timestamptz,
    {finished_at} timestamptz,
    {process_after} timestamptz,
    {num_resets} integer NOT NULL DEFAULT 0,
    {num_failures} integer NOT NULL DEFAULT 0,
    {last_heartbeat_at} timestamptz,
    {execution_logs} json[],
    {worker_hostname} text NOT NULL DEFAULT '',
    {cancel} boolean NOT NULL DEFAULT false
);

-- The claim scans eligible rows in id order; a partial index keeps it small.
CREATE INDEX IF NOT EXISTS {dequeue_idx} ON {table} ({id}) WHERE {state} IN ('queued', 'errored');
-- The resetter looks only at processing rows. Keyed on id, not the heartbeat
-- column, so heartbeats stay HOT updates.
CREATE INDEX IF NOT EXISTS {processing_idx} ON {table} ({id}) WHERE {state} = 'processing';
-- Claims leave dead index entries behind; vacuum this table often.
ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
"#,
        id = q(&c.id),
        state = q(&c.state),
        failure_message = q(&c.failure_message),
        queued_at = q(&c.queued_at),
        started_at = q(&c.started_at),
        finished_at = q(&c.finished_at),
        process_after = q(&c.process_after),
        num_resets = q(&c.num_resets),
        num_failures = q(&c.num_failures),
        last_heartbeat_at = q(&c.last_heartbeat_at),
        execution_logs = q(&c.execution_logs),
        worker_hostname = q(&c.worker_hostname),
        cancel = q(&c.cancel),
        dequeue_idx = index("dequeue_idx"),
        processing_idx = index("processing_idx"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_reach_the_ddl() {
        let mut renames = HashMap::new();
        renames.insert("state".to_owned(), "status".to_owned());
        let ddl = job_table_sql("app.jobs", &renames).unwrap();
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."jobs""#));
        assert!(ddl.contains(r#""status" text NOT NULL DEFAULT 'queued'"#));
        assert!(ddl.contains(r#"WHERE "status" IN ('queued', 'errored')"#));
        assert!(!ddl.contains(r#""state""#));
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(job_table_sql("jobs; drop table x", &HashMap::new()).is_err());
    }
}
