//! A transactional handler stuck in a query that does not end on its own,
//! and how a test sees that such queries were ended: shared by
//! dbworker/tests/worker/transactional_connections.rs and
//! dbworker/tests/pgbouncer/pgbouncer_abandon.rs (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use dbworker::{DbJob, DbStore};
use serde_json::json;
use workerutil::{Handler, HandlerError, JobContext};

use crate::common::{Db, Job};

/// Runs one query that does not end on its own on the job's transaction:
/// `pg_sleep(600)`, or (payload `"lock"`) an update of the `side_effects`
/// row with `job_id` 0, which the test holds locked. Tells the test once it
/// starts.
pub struct Stuck(pub tokio::sync::mpsc::UnboundedSender<()>);
impl Handler<DbStore<Job>> for Stuck {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let sql = if job.record().payload["wait"] == json!("lock") {
            "UPDATE side_effects SET note = 'stuck' WHERE job_id = 0"
        } else {
            "SELECT pg_sleep(600)"
        };
        let _ = self.0.send(());
        sqlx::query(sql)
            .execute(job.tx().expect("transactional handling"))
            .await?;
        Ok(())
    }
}

/// Sessions other than the caller's still running the handler's query.
pub async fn stuck_backends(db: &Db) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
           AND (query LIKE '%pg_sleep(600)%' OR query LIKE '%SET note = ''stuck''%')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Whether another session can lock the job's row at once.
pub async fn row_free(db: &Db, id: i64) -> bool {
    let mut tx = db.pool.begin().await.unwrap();
    let locked = sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await;
    // Ended here, not by the pool's task: none of the test's own sessions
    // may look idle in a transaction afterwards.
    tx.rollback().await.unwrap();
    locked.is_ok()
}

/// Whether, within two seconds, the stuck queries are gone and the rows of
/// `ids` free (a terminated backend exits a moment after the signal).
pub async fn released(db: &Db, ids: &[i64]) -> bool {
    for _ in 0..100 {
        let mut free = stuck_backends(db).await == 0;
        for id in ids {
            free = free && row_free(db, *id).await;
        }
        if free {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
