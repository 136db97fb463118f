//! Per-test databases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgPool};

use crate::process_tag::process_tag;
use crate::{Error, server, url};

/// How long dropping a database may take before we give up on it.
const DROP_TIMEOUT: Duration = Duration::from_secs(30);
/// How many names are tried when a database of the same name already exists.
const CREATE_ATTEMPTS: usize = 5;

fn next_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("dbworker_test_{}_{}_{n}", std::process::id(), process_tag())
}

/// A fresh database for one test or example; dropped (`DROP DATABASE ... WITH (FORCE)`) when
/// this value is dropped.
///
/// Every value has its own database, so tests using different values can run in parallel without
/// seeing each other's tables or rows. Dropping the value blocks until the database is gone
/// (connections still open to it, e.g. from a pool that outlives it, are terminated).
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl TestDatabase {
    /// Creates a new uniquely named database (`dbworker_test_<pid>_<tag>_<counter>`) on the
    /// server: the one named by `DATABASE_URL` if that variable is set (connecting to it and
    /// running `CREATE DATABASE` there), otherwise on a throwaway cluster this process starts on
    /// first use (shared by all `TestDatabase` values of the process; see [`server`]).
    ///
    /// # Errors
    ///
    /// Whatever [`server`] returns, or [`Error::Sqlx`] if the database cannot be created.
    pub async fn new() -> Result<TestDatabase, Error> {
        let server = server()?;
        let admin_url = server.admin_url().to_owned();
        let mut admin = PgConnection::connect(&admin_url).await?;
        let result = create_database(&mut admin, &admin_url, server.is_throwaway()).await;
        let _ = admin.close().await;
        let (name, url) = result?;
        tracing::debug!(database = %name, "created test database");
        Ok(TestDatabase {
            name,
            url,
            admin_url,
        })
    }

    /// Creates a new uniquely named database, like [`TestDatabase::new`], on the server whose
    /// maintenance database is `admin_url` (e.g. [`ThrowawayServer::admin_url`]) instead of the
    /// process-wide one.
    ///
    /// [`ThrowawayServer::admin_url`]: crate::ThrowawayServer::admin_url
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for an unusable URL, or [`Error::Sqlx`] if the database cannot be
    /// created.
    pub async fn new_on(admin_url: &str) -> Result<TestDatabase, Error> {
        let mut admin = PgConnection::connect(admin_url).await?;
        // The default (WAL-logged) strategy: the server may run with durable settings.
        let result = create_database(&mut admin, admin_url, false).await;
        let _ = admin.close().await;
        let (name, url) = result?;
        tracing::debug!(database = %name, "created database");
        Ok(TestDatabase {
            name,
            url,
            admin_url: admin_url.to_owned(),
        })
    }

    /// The connection URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The name of the database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new pool ([`sqlx::PgPool`]) to this database with the given max connections. With
    /// `DBWORKER_TEST_PGBOUNCER=host:port` set (a PgBouncer in front of the same server that
    /// serves any database name, as the examples' pooler test starts one), the pool goes
    /// through that pooler.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] if no connection can be made, [`Error::InvalidUrl`] for an unusable
    /// `DBWORKER_TEST_PGBOUNCER`.
    pub async fn pool(&self, max_connections: u32) -> Result<PgPool, Error> {
        let url = match std::env::var("DBWORKER_TEST_PGBOUNCER") {
            Ok(address) if !address.is_empty() => url::through(&self.url, &address)
                .map_err(|reason| url::invalid(&self.url, reason))?,
            _ => self.url.clone(),
        };
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&url)
            .await?;
        Ok(pool)
    }

    /// Runs `migrator` on a connection straight to this database, never through a pooler: a
    /// migration holds a session-level advisory lock and prepares its statements under names,
    /// neither of which a pooler in transaction mode keeps between transactions.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] if no connection can be made, [`Error::Migrate`] if a migration fails.
    pub async fn migrate(&self, migrator: &sqlx::migrate::Migrator) -> Result<(), Error> {
        let mut conn = PgConnection::connect(&self.url).await?;
        let done = migrator.run(&mut conn).await;
        let _ = conn.close().await;
        done.map_err(Error::Migrate)
    }
}

/// Whether `STRATEGY FILE_COPY` is still worth trying (it is unknown before PostgreSQL 15).
static FILE_COPY_SUPPORTED: AtomicBool = AtomicBool::new(true);

async fn create_database(
    admin: &mut PgConnection,
    admin_url: &str,
    throwaway: bool,
) -> Result<(String, String), Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let name = next_name();
        let url = url::with_database(admin_url, &name)
            .map_err(|reason| url::invalid(admin_url, reason))?;
        // template0: nobody is ever connected to it, unlike template1, so concurrent
        // CREATE DATABASE statements do not trip over each other.
        let mut sql = format!(r#"CREATE DATABASE "{name}" TEMPLATE template0"#);
        // On the throwaway cluster (fsync off) copying the files is about three times faster
        // than the WAL-logged default of PostgreSQL 15+; on a shared server the checkpoints it
        // forces could hurt others, so the default is kept there.
        let file_copy = throwaway && FILE_COPY_SUPPORTED.load(Ordering::Relaxed);
        if file_copy {
            sql.push_str(" STRATEGY FILE_COPY");
        }
        match sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *admin).await {
            Ok(_) => return Ok((name, url)),
            // syntax_error: `option "strategy" not recognized` before PostgreSQL 15.
            Err(sqlx::Error::Database(e)) if file_copy && e.code().as_deref() == Some("42601") => {
                FILE_COPY_SUPPORTED.store(false, Ordering::Relaxed);
            }
            // duplicate_database: a leftover of an earlier run; pick the next name.
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("42P04") && attempt < CREATE_ATTEMPTS => {}
            Err(e) => return Err(e.into()),
        }
    }
}

async fn drop_database(admin_url: &str, name: &str) -> Result<(), Error> {
    let mut admin = PgConnection::connect(admin_url).await?;
    let forced = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
    let result = match sqlx::raw_sql(AssertSqlSafe(forced))
        .execute(&mut admin)
        .await
    {
        // syntax_error: a server older than 13 has no WITH (FORCE).
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42601") => {
            let terminate = format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            );
            sqlx::raw_sql(AssertSqlSafe(terminate))
                .execute(&mut admin)
                .await?;
            let plain = format!(r#"DROP DATABASE IF EXISTS "{name}""#);
            sqlx::raw_sql(AssertSqlSafe(plain))
                .execute(&mut admin)
                .await
                .map(drop)
        }
        other => other.map(drop),
    };
    let _ = admin.close().await;
    Ok(result?)
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime (where block_on panics), so use a thread of our own
        // with a runtime of its own.
        let spawned = std::thread::Builder::new()
            .name("dbworker-testkit-drop".to_owned())
            .spawn(move || -> Result<(), Error> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::io("building a runtime to drop the database", e))?;
                runtime.block_on(async {
                    match tokio::time::timeout(DROP_TIMEOUT, drop_database(&admin_url, &name)).await
                    {
                        Ok(result) => result,
                        Err(_) => Err(Error::io(
                            "dropping the database",
                            std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("gave up after {DROP_TIMEOUT:?}"),
                            ),
                        )),
                    }
                })
            });
        let outcome = match spawned {
            Ok(handle) => handle.join(),
            Err(e) => Ok(Err(Error::io("spawning a thread to drop the database", e))),
        };
        match outcome {
            Ok(Ok(())) => tracing::debug!(database = %self.name, "dropped test database"),
            Ok(Err(e)) => {
                tracing::warn!(database = %self.name, error = %e, "could not drop test database");
            }
            Err(_) => {
                tracing::warn!(database = %self.name, "thread dropping test database panicked");
            }
        }
    }
}
