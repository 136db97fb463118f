//! Zero-configuration PostgreSQL for tests and examples.
//!
//! [`TestDatabase::new`] gives every test a fresh, empty database of its own, dropped again when
//! the value is dropped. The databases live on
//!
//! * the server named by the `DATABASE_URL` environment variable, if it is set (the URL must
//!   allow `CREATE DATABASE`); or otherwise
//! * a throwaway cluster that the process creates (`initdb`) and starts on first use, in a
//!   temporary directory, listening on a free port of 127.0.0.1 with durability turned off for
//!   speed. When running as root, the cluster is owned and run by the `postgres` system user.
//!   A detached watchdog stops the server and deletes its directory once the process has exited,
//!   however it exits. The server binaries are located with [`find_pg_bin_dir`].
//!
//! Measurements that need other settings (durable ones, preloaded libraries) start a
//! [`ThrowawayServer`] of their own and create databases on it with [`TestDatabase::new_on`].
//!
//! ```no_run
//! use dbworker_testkit::TestDatabase;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let db = TestDatabase::new().await?;
//! let pool = db.pool(5).await?;
//! sqlx::raw_sql("CREATE TABLE jobs (id bigserial PRIMARY KEY, state text NOT NULL)")
//!     .execute(&pool)
//!     .await?;
//! let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs")
//!     .fetch_one(&pool)
//!     .await?;
//! assert_eq!(n, 0);
//! println!("using {} at {}", db.name(), db.url());
//! // Dropping `db` drops the database (and ends connections still open to it).
//! # Ok(())
//! # }
//! ```

// The README's example runs (or compiles) as a doctest (crates.io shows the README).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod bin_dir;
mod cluster;
mod database;
mod error;
mod layout;
mod owner;
pub mod pgbouncer;
mod postmaster;
mod process_tag;
mod server;
mod skip;
mod throwaway;
mod tls;
mod url;
mod watchdog;

pub use bin_dir::find_pg_bin_dir;
pub use database::TestDatabase;
pub use error::Error;
pub use server::{Server, server};
pub use skip::skip;
pub use throwaway::ThrowawayServer;
pub use tls::TlsServer;
