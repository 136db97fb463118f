//! Tests against a real server: the throwaway cluster, or `DATABASE_URL` when set.

use std::collections::HashSet;

use dbworker_testkit::{TestDatabase, ThrowawayServer, find_pg_bin_dir, server};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};

async fn select_one(pool: &PgPool) -> i32 {
    let (one,): (i32,) = sqlx::query_as("SELECT 1")
        .fetch_one(pool)
        .await
        .expect("SELECT 1");
    one
}

async fn database_exists(name: &str) -> bool {
    let mut admin = PgConnection::connect(server().unwrap().admin_url())
        .await
        .expect("connect to the admin database");
    let (exists,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut admin)
            .await
            .expect("query pg_database");
    admin.close().await.expect("close");
    exists
}

#[tokio::test]
async fn two_databases_are_distinct_and_isolated() {
    let a = TestDatabase::new().await.expect("first database");
    let b = TestDatabase::new().await.expect("second database");
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    assert!(a.url().contains(&format!("/{}", a.name())), "{}", a.url());

    let pool_a = a.pool(2).await.expect("pool a");
    let pool_b = b.pool(2).await.expect("pool b");
    assert_eq!(select_one(&pool_a).await, 1);
    assert_eq!(select_one(&pool_b).await, 1);

    let (current,): (String,) = sqlx::query_as("SELECT current_database()::text")
        .fetch_one(&pool_a)
        .await
        .unwrap();
    assert_eq!(current, a.name());

    sqlx::raw_sql("CREATE TABLE only_in_a (id int)")
        .execute(&pool_a)
        .await
        .expect("create table in a");
    let (in_a,): (Option<String>,) = sqlx::query_as("SELECT to_regclass('only_in_a')::text")
        .fetch_one(&pool_a)
        .await
        .unwrap();
    let (in_b,): (Option<String>,) = sqlx::query_as("SELECT to_regclass('only_in_a')::text")
        .fetch_one(&pool_b)
        .await
        .unwrap();
    assert_eq!(in_a.as_deref(), Some("only_in_a"));
    assert_eq!(in_b, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_removes_the_database_even_with_open_connections() {
    let db = TestDatabase::new().await.expect("database");
    let name = db.name().to_owned();
    assert!(database_exists(&name).await);

    // A pool that outlives the database must not prevent the drop.
    let pool = db.pool(1).await.expect("pool");
    assert_eq!(select_one(&pool).await, 1);
    drop(db);

    assert!(!database_exists(&name).await, "{name} still exists");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creation_works() {
    let tasks: Vec<_> = (0..8).map(|_| tokio::spawn(TestDatabase::new())).collect();
    let mut dbs = Vec::new();
    for task in tasks {
        dbs.push(task.await.unwrap().expect("concurrent database"));
    }
    let names: HashSet<_> = dbs.iter().map(|db| db.name().to_owned()).collect();
    assert_eq!(names.len(), dbs.len());
}

#[test]
fn server_matches_the_environment() {
    let server = server().expect("server");
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            assert!(!server.is_throwaway());
            assert_eq!(server.admin_url(), url.trim());
        }
        _ => {
            assert!(server.is_throwaway());
            assert!(
                server
                    .admin_url()
                    .starts_with("postgres://postgres@127.0.0.1:"),
                "{}",
                server.admin_url()
            );
            assert!(server.admin_url().ends_with("/postgres"));
        }
    }
    // The same value every time.
    assert!(std::ptr::eq(server, dbworker_testkit::server().unwrap()));
}

#[test]
fn finds_the_server_binaries() {
    let dir = find_pg_bin_dir().expect("PostgreSQL server binaries");
    for name in ["initdb", "pg_ctl", "postgres"] {
        assert!(dir.join(name).is_file(), "{} lacks {name}", dir.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throwaway_server_runs_with_the_given_settings_and_goes_away_on_drop() {
    let server = ThrowawayServer::start(&["fsync=on", "work_mem=8MB"]).expect("start");
    let data_dir = server.data_dir().to_owned();
    assert!(data_dir.is_dir());
    let db = TestDatabase::new_on(server.admin_url())
        .await
        .expect("database");
    let pool = db.pool(1).await.expect("pool");
    let (fsync, work_mem): (String, String) =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('work_mem')")
            .fetch_one(&pool)
            .await
            .expect("settings");
    // The shared test cluster runs with fsync off; this one does as told.
    assert_eq!((fsync.as_str(), work_mem.as_str()), ("on", "8MB"));
    pool.close().await;
    drop(db);
    drop(server);
    assert!(!data_dir.exists(), "{} is left behind", data_dir.display());
}
