//! Retention: deletes (or archives) finished rows older than a per-state age,
//! in small batches, in a worker process or alone (`dbworker purge`).

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use workerutil::JobState;

use crate::columns::{Columns, Relation};
use crate::error::{Error, Result};
use crate::metrics::PURGED_TOTAL;
use crate::sql::{self, PurgeTable};

/// What to purge from a job table, and how.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PurgeOptions {
    /// The job table (optionally schema-qualified; an alias is ignored).
    pub table_name: String,
    /// Renamed standard columns, as in the store options.
    pub alternate_column_names: HashMap<String, String>,
    /// Final states to purge and how long after `finished_at` (database
    /// clock) a row of each goes. States not listed are kept. Default:
    /// completed after 7 days, failed and canceled after 30.
    pub max_age: Vec<(JobState, Duration)>,
    /// Rows per statement: each batch is one short transaction, so the purger
    /// never holds many locks or a long snapshot. Default 1,000.
    pub batch_size: u32,
    /// Move rows here instead of deleting them: a table with the job table's
    /// columns (`CREATE TABLE archive (LIKE jobs)`). Default `None` (delete).
    pub archive_table: Option<String>,
    /// Time between passes of [`Purger::run`]. Default 60 s.
    pub interval: Duration,
}

impl PurgeOptions {
    /// Options for `table_name` with the defaults.
    pub fn new(table_name: impl Into<String>) -> Self {
        const DAY: u64 = 24 * 3600;
        PurgeOptions {
            table_name: table_name.into(),
            alternate_column_names: HashMap::new(),
            max_age: vec![
                (JobState::Completed, Duration::from_secs(7 * DAY)),
                (JobState::Failed, Duration::from_secs(30 * DAY)),
                (JobState::Canceled, Duration::from_secs(30 * DAY)),
            ],
            batch_size: 1_000,
            archive_table: None,
            interval: Duration::from_secs(60),
        }
    }

    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<()> {
        self.resolve().map(|_| ())
    }

    pub(crate) fn resolve(&self) -> Result<PurgeTable> {
        let invalid = |field: &'static str, reason: String| Error::InvalidOption { field, reason };
        let table = Relation::parse("table_name", &self.table_name)?;
        let columns = Columns::resolve(&self.alternate_column_names)?;
        for (state, _) in &self.max_age {
            if !state.is_final() {
                return Err(invalid(
                    "max_age",
                    format!("{state:?} is not a final state; only finished rows are purged"),
                ));
            }
        }
        if self.batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1".into()));
        }
        if self.interval.is_zero() {
            return Err(invalid("interval", "must be positive".into()));
        }
        let archive = match &self.archive_table {
            Some(name) => Some(Relation::parse("archive_table", name)?),
            None => None,
        };
        Ok(PurgeTable {
            table,
            columns,
            archive,
        })
    }
}

/// Deletes or archives old finished rows of one job table.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), dbworker::Error> {
/// use std::time::Duration;
/// use dbworker::maintenance::{PurgeOptions, Purger};
/// let mut options = PurgeOptions::new("email_jobs");
/// options.max_age = vec![(workerutil::JobState::Completed, Duration::from_secs(3600))];
/// let purger = Purger::new(&pool, options).await?;
/// let purged = purger.purge_once().await?;
/// println!("purged {}", purged.total());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Purger {
    pool: PgPool,
    options: PurgeOptions,
    target: PurgeTable,
}

/// What one pass purged, per state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Rows deleted (or archived), by state.
    pub by_state: Vec<(JobState, u64)>,
}

impl Purged {
    /// Rows purged in all.
    pub fn total(&self) -> u64 {
        self.by_state.iter().map(|(_, n)| n).sum()
    }
}

impl Purger {
    /// Validates the options and checks the table (and the archive table).
    pub async fn new(pool: &PgPool, options: PurgeOptions) -> Result<Purger> {
        let pool = pool.clone();
        let target = options.resolve()?;
        let mut problems = Vec::new();
        crate::schema_check::check_table(&pool, &target.table, &target.columns, &mut problems)
            .await?;
        if let Some(archive) = &target.archive {
            let hint = format!(
                "CREATE TABLE {} (LIKE {})",
                archive.display_name(),
                target.table.display_name()
            );
            problems.extend(
                crate::schema_check::missing_columns(&pool, archive, "archive table", &[], &hint)
                    .await?,
            );
        }
        crate::schema_check::none(problems)?;
        Ok(Purger {
            pool,
            options,
            target,
        })
    }

    /// Purges every configured state in batches until none is left that old.
    pub async fn purge_once(&self) -> Result<Purged> {
        let mut purged = Purged::default();
        for &(state, age) in &self.options.max_age {
            let mut n: u64 = 0;
            loop {
                let rows = sql::purge_batch(&self.target, state, age, self.options.batch_size)
                    .query()
                    .fetch_all(&self.pool)
                    .await
                    .map_err(Error::db("purge"))?;
                let count = rows.len() as u64;
                n += count;
                if count < u64::from(self.options.batch_size) {
                    break;
                }
            }
            metrics::counter!(
                PURGED_TOTAL,
                "table" => self.target.table.display_name(),
                "state" => state.as_str()
            )
            .increment(n);
            if n > 0 {
                tracing::info!(table = %self.target.table.display_name(), state = state.as_str(), rows = n, "purged");
            }
            purged.by_state.push((state, n));
        }
        Ok(purged)
    }

    /// Purges every `interval` until `stop` fires. A failed pass is logged and
    /// retried at the next one.
    pub async fn run(&self, stop: CancellationToken) {
        loop {
            if let Err(err) = self.purge_once().await {
                tracing::error!(table = %self.target.table.display_name(), error = %err, "purge pass failed");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.options.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_final_states_and_sane_sizes_are_accepted() {
        let mut o = PurgeOptions::new("jobs");
        assert!(o.validate().is_ok());
        o.max_age = vec![(JobState::Queued, Duration::from_secs(1))];
        assert!(o.validate().unwrap_err().to_string().contains("max_age"));
        let mut o = PurgeOptions::new("jobs");
        o.batch_size = 0;
        assert!(o.validate().unwrap_err().to_string().contains("batch_size"));
    }
}
