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
/// row with `job_id` 0, which the test holds locked; first (payload
/// `"report": true`) it sets progress and reports more; with `"own"` it
/// drops its own `pg_sleep` after 300 ms and returns an error. Tells the
/// test once it starts.
pub struct Stuck(pub tokio::sync::mpsc::UnboundedSender<()>);
impl Handler<DbStore<Job>> for Stuck {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let sql = if job.record().payload["wait"] == json!("lock") {
            "UPDATE side_effects SET note = 'stuck' WHERE job_id = 0"
        } else {
            "SELECT pg_sleep(600)"
        };
        if job.record().payload["report"] == json!(true) {
            // Written in the job's transaction, which then holds the row:
            // heartbeats skip it, so the report stays for the final mark.
            job.set_progress(ctx.store(), json!({ "step": 1 })).await?;
            job.report_progress(ctx.store(), json!({ "step": 2 }))?;
        }
        let _ = self.0.send(());
        let gives_up = job_gives_up(job);
        let query = sqlx::query(sql).execute(job.tx().expect("transactional handling"));
        if gives_up {
            // The handler drops its own query and returns an error.
            return match tokio::time::timeout(Duration::from_millis(300), query).await {
                Ok(done) => done.map(drop).map_err(Into::into),
                Err(_) => Err(HandlerError::retryable("gave up on its own query")),
            };
        }
        query.await?;
        Ok(())
    }
}

/// Whether the job's handler gives up on its query itself (payload `"own"`).
fn job_gives_up(job: &DbJob<Job>) -> bool {
    job.record().payload["wait"] == json!("own")
}

/// Sessions other than the caller's still running the handler's query.
pub async fn stuck_backends(db: &Db) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
           AND datname = current_database()
           AND (query LIKE 'SELECT pg_sleep(600)%' OR query LIKE 'UPDATE side_effects SET note = ''stuck''%')",
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
