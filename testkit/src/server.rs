//! The process-wide PostgreSQL server: `DATABASE_URL`, or a throwaway cluster.

use std::fs;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::cluster::{admin_url, init_and_start, prepare_cluster_dir};
use crate::{Error, url};

/// The server tests run against: the URL of its maintenance database, and whether this process
/// started it.
#[derive(Debug)]
pub struct Server {
    admin_url: String,
    cluster: Option<Cluster>,
}

/// What this process knows about the throwaway cluster it started.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "only read through Debug, to help whoever debugs a test"
)]
struct Cluster {
    /// The temporary directory holding data, socket and log; removed by the watchdog.
    base_dir: PathBuf,
    /// The postmaster's process id.
    pid: u32,
}

impl Server {
    /// The URL of the server's maintenance database (for a throwaway cluster
    /// `postgres://postgres@127.0.0.1:<port>/postgres`; otherwise `DATABASE_URL` as given),
    /// to be used for `CREATE DATABASE`, `DROP DATABASE` and catalog queries.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Whether this process started the server (a throwaway cluster, removed when the process
    /// exits) rather than using `DATABASE_URL`.
    pub fn is_throwaway(&self) -> bool {
        self.cluster.is_some()
    }
}

static SERVER: OnceLock<Server> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Returns the process-wide server, starting the throwaway cluster on the first call if
/// `DATABASE_URL` is unset (or empty).
///
/// This is synchronous and may block for a second or two on the first call (while `initdb`
/// runs and the server starts); calling it from inside a tokio runtime is fine. If start-up
/// fails, the error is returned and the next call tries again.
///
/// The throwaway cluster lives in a temporary directory under [`std::env::temp_dir`] and is
/// stopped and deleted by a small watchdog process shortly after this process exits, however
/// it exits.
///
/// # Errors
///
/// [`Error::InvalidUrl`] for an unusable `DATABASE_URL`; otherwise whatever prevented the
/// cluster from starting ([`Error::BinariesNotFound`], [`Error::Command`],
/// [`Error::ServerExited`], [`Error::Timeout`], ...).
pub fn server() -> Result<&'static Server, Error> {
    if let Some(server) = SERVER.get() {
        return Ok(server);
    }
    let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(server) = SERVER.get() {
        return Ok(server);
    }
    let server = discover()?;
    Ok(SERVER.get_or_init(|| server))
}

fn discover() -> Result<Server, Error> {
    match std::env::var("DATABASE_URL") {
        Ok(given) if !given.trim().is_empty() => {
            let given = given.trim().to_owned();
            // Validate now, so that a bad URL is reported clearly rather than by sqlx later.
            url::with_database(&given, "x").map_err(|reason| url::invalid(&given, reason))?;
            Ok(Server {
                admin_url: given,
                cluster: None,
            })
        }
        _ => start_throwaway(),
    }
}

/// Settings of the shared test cluster: durability traded for speed.
const TEST_SETTINGS: [&str; 4] = [
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "shared_buffers=128MB",
];

fn start_throwaway() -> Result<Server, Error> {
    let layout = prepare_cluster_dir("dbworker-testkit")?;
    match init_and_start(&layout, &TEST_SETTINGS) {
        Ok((port, pid)) => Ok(Server {
            admin_url: admin_url(port),
            cluster: Some(Cluster {
                base_dir: layout.base_dir,
                pid,
            }),
        }),
        Err(e) => {
            let _ = fs::remove_dir_all(&layout.base_dir);
            Err(e)
        }
    }
}
