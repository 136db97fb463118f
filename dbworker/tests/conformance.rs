//! The Postgres store passes the same conformance suite as the in-memory store,
//! in both handling modes.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use dbworker::sea_query::Expr;
use dbworker::{DbConditions, DbStore, Handling};
use workerutil::conformance::{self, Harness};
use workerutil::{ExecutionLogEntry, JobState, RecordId};

use common::{Db, Job};

struct Postgres {
    db: Db,
    handling: Handling,
    /// Jobs queued over ten days, so a partitioned table holds them in ten partitions.
    spread: bool,
}

#[async_trait]
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
        self.db.store_on(&self.db.table().await, o).await
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
        DbConditions::new().and(Expr::cust_with_values("j.id = ANY($1)", [ids.to_vec()]))
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

#[tokio::test]
async fn postgres_store_passes_the_conformance_suite_with_transactional_handling() {
    let h = Postgres {
        db: Db::new().await,
        handling: Handling::Transactional,
        spread: false,
    };
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn postgres_store_passes_the_conformance_suite_with_heartbeat_handling() {
    let h = Postgres {
        db: Db::new().await,
        handling: Handling::Heartbeat,
        spread: false,
    };
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn partitioned_table_passes_the_conformance_suite_with_transactional_handling() {
    let h = Postgres {
        db: Db::partitioned().await,
        handling: Handling::Transactional,
        spread: true,
    };
    conformance::run_all(&h).await;
}

#[tokio::test]
async fn partitioned_table_passes_the_conformance_suite_with_heartbeat_handling() {
    let h = Postgres {
        db: Db::partitioned().await,
        handling: Handling::Heartbeat,
        spread: true,
    };
    conformance::run_all(&h).await;
}
