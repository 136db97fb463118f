//! Login roles holding exactly a list of grants, for the least-privilege
//! tests (dbworker/tests/operations/grants*.rs, through `#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use std::time::Duration;

use dbworker::{DbStore, JobTable, new_worker};
use workerutil::WorkerOptions;

use crate::common::{Completes, Db};

/// One role of the manual: its grants, each as `PRIVILEGE ON object`
/// (`USAGE ON SEQUENCE jobs_id_seq`), exactly as the manual writes them.
pub struct Grants(pub &'static [&'static str]);

static ROLES: AtomicUsize = AtomicUsize::new(0);

/// A login role of the test database holding `grants` and nothing else on
/// the job table; dropped with the database's roles at the end of the test.
pub async fn role_with(db: &Db, grants: &[&str]) -> (String, PgPool) {
    let n = ROLES.fetch_add(1, Ordering::Relaxed);
    let name = format!("r{n}_{}", db.db.name());
    let name = name[..name.len().min(63)].to_owned();
    let mut sql = format!(
        "CREATE ROLE \"{name}\" LOGIN; GRANT CONNECT ON DATABASE \"{}\" TO \"{name}\"; GRANT USAGE ON SCHEMA public TO \"{name}\";",
        db.db.name()
    );
    for g in grants {
        sql.push_str(&format!("GRANT {g} TO \"{name}\";"));
    }
    db.execute(&sql).await;
    let options: PgConnectOptions = db.db.url().parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(options.username(&name));
    (name, pool)
}

pub async fn drop_role(db: &Db, pool: PgPool, name: &str) {
    pool.close().await;
    db.execute(&format!("DROP OWNED BY \"{name}\"; DROP ROLE \"{name}\""))
        .await;
}

/// For each of `grants`, a role with all the others: `start` must fail, its
/// error naming the missing privilege on its object with the GRANT for the
/// role.
pub async fn each_grant_is_needed<F, Fut>(db: &Db, grants: &Grants, start: F)
where
    F: Fn(PgPool) -> Fut,
    Fut: std::future::Future<Output = Result<(), dbworker::Error>>,
{
    for (i, missing) in grants.0.iter().enumerate() {
        let others: Vec<&str> = grants
            .0
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, g)| *g)
            .collect();
        let (name, pool) = role_with(db, &others).await;
        let err = start(pool.clone())
            .await
            .expect_err(&format!("started without {missing}"))
            .to_string()
            // A sequence is named as SQL quotes it.
            .replace('"', "");
        let (privilege, object) = missing.split_once(" ON ").unwrap();
        let object = object.trim_start_matches("SEQUENCE ");
        assert!(
            err.contains(&format!("role {name} lacks {privilege} on "))
                && err.contains(&format!("GRANT {privilege} ON "))
                && err.contains(&format!("{object} TO {name}")),
            "without {missing}: {err}"
        );
        drop_role(db, pool, &name).await;
    }
}

/// Runs a worker on `pool` (a role's) over `table` until it has completed
/// `jobs` jobs, with `options`.
pub async fn complete_jobs(
    pool: &PgPool,
    table: &JobTable,
    options: dbworker::StoreOptions,
    jobs: u64,
) {
    let store = std::sync::Arc::new(DbStore::new(pool, table, options).await.unwrap());
    let mut w = WorkerOptions::new("grants");
    w.interval = Duration::from_millis(20);
    w.heartbeat_interval = Duration::from_millis(100);
    w.heartbeat_failure_limit = Some(Duration::from_secs(2));
    w.num_total_jobs = Some(jobs);
    new_worker(store.clone(), Completes, w).unwrap().run().await;
    store.close().await;
}
