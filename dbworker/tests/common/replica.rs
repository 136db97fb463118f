//! A test database on a throwaway primary with a streaming replica of it
//! (`pg_basebackup -R`), shared by the dashboard's and the command line's
//! replica tests (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use dbworker_testkit::{ThrowawayServer, find_pg_bin_dir};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::common::Db;

/// The primary's test database and the replica's view of it; the servers
/// stop on drop (the replica first).
pub struct Replicated {
    pub db: Db,
    /// The test database on the replica.
    pub replica: PgPool,
    pub replica_url: String,
    replica_server: ThrowawayServer,
    primary: ThrowawayServer,
}

impl Replicated {
    /// Starts both, or prints why `test` is skipped and returns `None`
    /// when pg_basebackup is not installed beside the server binaries.
    pub async fn start_or_skip(test: &str) -> Option<Replicated> {
        if !find_pg_bin_dir().is_ok_and(|d| d.join("pg_basebackup").exists()) {
            dbworker_testkit::skip(
                test,
                "pg_basebackup is not installed next to the PostgreSQL server binaries",
            );
            return None;
        }
        let primary = ThrowawayServer::start(&["fsync=off"]).expect("primary");
        let db = Db::on_server(primary.admin_url()).await;
        let replica_server = primary.start_replica().expect("replica");
        // The test database on the replica: its URL with the replica's port.
        let port = |url: &str| {
            let options: PgConnectOptions = url.parse().unwrap();
            options.get_port()
        };
        let replica_url = db.db.url().replacen(
            &format!(":{}/", port(primary.admin_url())),
            &format!(":{}/", port(replica_server.admin_url())),
            1,
        );
        assert_ne!(replica_url, db.db.url());
        let replica = PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(replica_url.parse().unwrap());
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&replica)
            .await
            .unwrap();
        assert!(in_recovery, "the replica is a standby");
        Some(Replicated {
            db,
            replica,
            replica_url,
            replica_server,
            primary,
        })
    }

    /// Waits until the replica has replayed everything the primary wrote so far.
    pub async fn caught_up(&self) {
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        for _ in 0..500 {
            let behind: bool =
                sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() < $1::text::pg_lsn")
                    .bind(&lsn)
                    .fetch_one(&self.replica)
                    .await
                    .unwrap();
            if !behind {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the replica never replayed up to {lsn}");
    }
}
