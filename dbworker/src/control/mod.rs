//! Control tables shared by every process: durable [`Pauses`] of a table or a
//! queue, and global [`Limits`] (processing, per key, rate) the claim enforces.

pub(crate) mod limits;
pub(crate) mod pauses;

pub use limits::LimitsOptions;
pub use limits::{DEFAULT_LIMIT_TABLE, Limit, Limits};
pub use pauses::PausesOptions;
pub use pauses::{DEFAULT_PAUSE_TABLE, Pause, Pauses};

use sqlx::PgPool;

use crate::columns::Relation;
use crate::error::Result;
use crate::sql;

/// What [`Pauses`] and [`Limits`] share: a control table (one for every job
/// table) and the job table its rows are keyed by.
#[derive(Debug, Clone)]
struct ControlTable {
    pool: PgPool,
    table: Relation,
    /// The job table as the control rows name it (`schema.name` or `name`).
    job_table: String,
}

impl ControlTable {
    /// The control table `table_name` (option `field`) for `job_table`, after
    /// `problems` found nothing wrong with it.
    async fn open<F, Fut>(
        pool: &PgPool,
        field: &'static str,
        table_name: &str,
        job_table: &Relation,
        problems: F,
    ) -> Result<ControlTable>
    where
        F: FnOnce(PgPool, Relation) -> Fut,
        Fut: Future<Output = Result<Vec<String>>>,
    {
        let table = Relation::parse(field, table_name)?;
        crate::schema_check::none(problems(pool.clone(), table.clone()).await?)?;
        Ok(ControlTable {
            pool: pool.clone(),
            job_table: sql::pause_key(job_table),
            table,
        })
    }
}
