//! Control tables shared by every process: durable [`Pauses`] of a table or a
//! queue, global [`Limits`] (processing, per key, rate) the claim enforces,
//! and the [`FairWeights`] of a fair table's keys.
//!
#![doc = include_str!("../../docs/modules/control.md")]

pub(crate) mod fairness;
pub(crate) mod limits;
pub(crate) mod pauses;

pub use fairness::{FairShare, FairWeights, MAX_FAIR_WEIGHT};
pub use limits::{DEFAULT_LIMIT_TABLE, Limit, Limits};
pub use pauses::PausesOptions;
pub use pauses::{DEFAULT_PAUSE_TABLE, Pause, Pauses};

use sqlx::PgPool;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::grants::{Grants, Privilege};
use crate::sql;
use crate::table::JobTable;

/// What [`Pauses`] and [`Limits`] share: a control table (one for every job
/// table) and the job table its rows are keyed by.
#[derive(Debug, Clone)]
struct ControlTable {
    pool: PgPool,
    table: Relation,
    /// The job table as the control rows name it (`schema.name` or `name`).
    job_table: String,
    /// The job table's queue column, as this description names it.
    queue_column: Option<String>,
}

impl ControlTable {
    /// The control table `table` (checked by `JobTable::new`) for `job_table`.
    fn new(pool: &PgPool, table: Relation, job: &JobTable) -> ControlTable {
        ControlTable {
            pool: pool.clone(),
            job_table: sql::pause_key(job.relation()),
            table,
            queue_column: job.sql().queue_column.clone(),
        }
    }

    /// Whether this description of the job table names a queue column (its
    /// queues can be listed; other descriptions may still name one).
    fn has_queues(&self) -> bool {
        self.queue_column.is_some()
    }

    /// Checks that the role has `privileges` on the control table (its
    /// `what`: "pause table"), which `needed_by` needs.
    async fn check(
        &self,
        what: &'static str,
        needed_by: &'static str,
        privileges: &[Privilege],
    ) -> Result<()> {
        Grants::new(needed_by)
            .on(what, &self.table, privileges)
            .check(&self.pool)
            .await
    }

    /// `job`'s control table in `slot`, or an error naming the option to set.
    fn of(
        pool: &PgPool,
        job: &JobTable,
        slot: Option<&Relation>,
        field: &'static str,
        migration: &str,
    ) -> Result<ControlTable> {
        match slot {
            Some(table) => Ok(ControlTable::new(pool, table.clone(), job)),
            None => Err(Error::InvalidOption {
                field,
                reason: format!(
                    "table {} has no {field}: set JobTableOptions::{field} (`dbworker migration {migration}` creates {})",
                    job.name(),
                    if field == "pause_table" {
                        DEFAULT_PAUSE_TABLE
                    } else {
                        DEFAULT_LIMIT_TABLE
                    }
                ),
            }),
        }
    }
}

/// Refuses a queue name that a pause or a limit cannot mean: empty or blank
/// (a form's empty field once paused the whole table), or with whitespace at
/// either end. Names are taken exactly, so " a" and "a" would be two queues;
/// a stray space is a typo, refused here rather than trimmed by one feature
/// and kept by another.
pub(crate) fn check_queue_name(queue: &str) -> Result<()> {
    let reason = if queue.trim().is_empty() {
        "name the queue (empty or blank names are refused)".to_owned()
    } else if queue.trim() != queue {
        format!(
            "{} has whitespace at an end; queue names are taken exactly",
            crate::job_filter::excerpt(queue)
        )
    } else {
        return Ok(());
    };
    Err(Error::InvalidOption {
        field: "queue",
        reason,
    })
}
