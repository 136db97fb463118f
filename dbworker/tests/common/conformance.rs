//! The Postgres store's harness for workerutil's conformance suite, shared by
//! dbworker/tests/worker/conformance.rs and dbworker/tests/pgbouncer/pgbouncer_conformance.rs.

#![allow(dead_code, unreachable_pub)]

use dbworker::{DbConditions, DbStore, Handling, JobTable};
use sqlx::PgPool;
use std::sync::Arc;
use workerutil::conformance::Harness;
use workerutil::{ExecutionLogEntry, JobState, RecordId};

use crate::common::{Db, Job};

/// The Postgres store under the conformance suite: its jobs set up and
/// inspected through `db.pool`, the store itself on `store_pool` (the same
/// pool, or one through a pooler).
pub struct Postgres {
    pub db: Db,
    pub handling: Handling,
    /// Jobs queued over ten days, so a partitioned table holds them in ten partitions.
    pub spread: bool,
    /// The pool the store runs its statements on.
    pub store_pool: PgPool,
}

impl Postgres {
    /// The harness over `db`, the store on `db`'s own pool.
    pub fn new(db: Db, handling: Handling, spread: bool) -> Postgres {
        let store_pool = db.pool.clone();
        Postgres {
            db,
            handling,
            spread,
            store_pool,
        }
    }
}
impl Harness for Postgres {
    type Store = DbStore<Job>;

    async fn new_store(&self, max_num_retries: u32) -> Arc<DbStore<Job>> {
        sqlx::query("TRUNCATE jobs RESTART IDENTITY")
            .execute(&self.db.pool)
            .await
            .unwrap();
        let mut o = self.db.options();
        o.max_num_retries = max_num_retries;
        o.stall.max_num_resets = 1;
        o.handling = self.handling;
        let table = JobTable::new(&self.store_pool, Db::table_options())
            .await
            .expect("job table");
        Arc::new(
            DbStore::new(&self.store_pool, &table, o)
                .await
                .expect("store"),
        )
    }

    async fn enqueue(&self, _store: &DbStore<Job>, n: usize) -> Vec<RecordId> {
        if self.spread {
            let ids = self.db.enqueue_spread(n, serde_json::json!({})).await;
            assert_eq!(self.db.partitions_in_use().await, n.min(10) as i64);
            ids
        } else {
            self.db.enqueue(n, serde_json::json!({})).await
        }
    }

    async fn state(&self, _store: &DbStore<Job>, id: RecordId) -> JobState {
        self.db.state(id).await.parse().unwrap()
    }

    async fn failure_message(&self, _store: &DbStore<Job>, id: RecordId) -> Option<String> {
        self.db
            .scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
            .await
    }

    async fn request_cancel(&self, _store: &DbStore<Job>, id: RecordId) {
        sqlx::query("UPDATE jobs SET cancel = true WHERE id = $1")
            .bind(id)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }

    async fn reset(&self, store: &DbStore<Job>, id: RecordId) {
        if self.handling == Handling::Transactional {
            // A live handler transaction locks the row and no resetter may take
            // it; a crashed worker's connection dies and its lock goes with it.
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
            )
            .execute(&self.db.pool)
            .await
            .unwrap();
        }
        self.db.age_heartbeats().await;
        let out = store.reset_stalled().await.unwrap();
        assert_eq!(
            out.reset.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![id],
            "resetter"
        );
    }

    fn only(&self, ids: &[RecordId]) -> DbConditions {
        DbConditions::new().and_sql("j.id = ANY($1)", [ids.to_vec()])
    }

    async fn execution_log(&self, _store: &DbStore<Job>, id: RecordId) -> Vec<ExecutionLogEntry> {
        let rows: Vec<serde_json::Value> = sqlx::query_scalar(
            "SELECT to_json(e) FROM jobs, unnest(execution_logs) AS e WHERE id = $1",
        )
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect()
    }
}
