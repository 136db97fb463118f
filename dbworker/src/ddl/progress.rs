//! Progress and checkpoints in a side table, for a job table its owner
//! cannot (or would rather not) alter.

use crate::columns::{Relation, progress_table};
use crate::error::Result;

/// Statements (safe to run again) that create `<table>_progress`, where the
/// jobs of `table_name` keep their progress and checkpoints when the table
/// has no `progress` columns (see
/// [checkpoints](crate::guide#progress-and-checkpoints)): one row per job
/// that reported any, keyed by the job's id, written only by the attempt
/// that owns the job (fenced by its claim token and numbered above
/// `progress_seq`, as the columns are). They touch nothing of the job table itself: a role
/// that may create tables in its schema runs them, and grants the workers
/// `SELECT, INSERT, UPDATE` on it, the purger `SELECT, DELETE` (it deletes
/// the purged jobs' rows), enqueuers of a table with job keys `SELECT, DELETE` (a
/// replaced holder's row is the old work's), readers `SELECT`. `JobTable::new` finds the table
/// (with `JobTableOptions::progress`, or detected).
///
/// ```
/// let ddl = dbworker::ddl::progress_table_sql("jobs").unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "jobs_progress""#));
/// ```
pub fn progress_table_sql(table_name: &str) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let side = progress_table(&rel).quoted();
    Ok(format!(
        r#"-- Progress and checkpoints in a side table (the job table is not altered):
-- JobTableOptions::progress = true, or detected; DbJob::set_progress, DbJob::save_checkpoint.
CREATE TABLE IF NOT EXISTS {side} (
    "job_id" bigint PRIMARY KEY,
    "progress" jsonb,
    "checkpoint" jsonb,
    "progress_seq" bigint NOT NULL DEFAULT 0
);
-- Heartbeats update it often; the purger deletes the rows of the jobs it purges.
ALTER TABLE {side} SET ({autovacuum});
"#,
        autovacuum = super::AUTOVACUUM,
    ))
}
