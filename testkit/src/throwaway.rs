//! A throwaway cluster owned by the caller, with settings of its choosing.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;
use crate::cluster::{
    admin_url, init_and_start, own_dirs, prepare_cluster_dir, start_on_free_port,
};
use crate::layout::{Layout, run};
use crate::owner::SERVER_USER;
use crate::postmaster::{StartError, start_postgres};

/// A throwaway cluster with settings of the caller's choosing, owned by this value: stopped
/// and deleted when it is dropped (and, should the process die first, by the same watchdog
/// that cleans up after the shared test cluster).
///
/// Unlike the process-wide [`server`](crate::server()) (tuned for test speed, with
/// `fsync=off`), nothing is traded for speed unless asked: the server runs with PostgreSQL's
/// defaults plus `listen_addresses=127.0.0.1`, `max_connections=300` and the given settings
/// (which win). Use it for measurements that must run with durable settings.
///
/// ```no_run
/// use dbworker_testkit::{TestDatabase, ThrowawayServer};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let server = ThrowawayServer::start(&["shared_preload_libraries=pg_stat_statements"])?;
/// let db = TestDatabase::new_on(server.admin_url()).await?;
/// println!("{}", db.url());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ThrowawayServer {
    admin_url: String,
    layout: Layout,
    pid: u32,
    port: u16,
    settings: Vec<String>,
}

impl ThrowawayServer {
    /// Runs `initdb` in a new temporary directory and starts a server with `settings`
    /// (`name=value`, as for `postgres -c`). Blocks until it accepts connections.
    ///
    /// # Errors
    ///
    /// Whatever prevented the cluster from starting ([`Error::BinariesNotFound`],
    /// [`Error::Command`], [`Error::ServerExited`] for a bad setting, [`Error::Timeout`], ...).
    pub fn start(settings: &[&str]) -> Result<ThrowawayServer, Error> {
        let layout = prepare_cluster_dir("dbworker-throwaway")?;
        match init_and_start(&layout, settings) {
            Ok((port, pid)) => Ok(ThrowawayServer {
                admin_url: admin_url(port),
                layout,
                pid,
                port,
                settings: settings.iter().map(|s| (*s).to_owned()).collect(),
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&layout.base_dir);
                Err(e)
            }
        }
    }

    /// Starts a streaming replica of this server: a `pg_basebackup -R` of it
    /// (the default `pg_hba.conf` of a throwaway cluster trusts replication
    /// from 127.0.0.1) into a new throwaway directory, started with the same
    /// settings on another free port as a hot standby that follows this
    /// server until it is dropped. Blocks until it accepts (read-only)
    /// connections.
    ///
    /// # Errors
    ///
    /// Whatever prevented the backup or the start ([`Error::Command`] when
    /// `pg_basebackup` is missing or refused, ...).
    pub fn start_replica(&self) -> Result<ThrowawayServer, Error> {
        let layout = prepare_cluster_dir("dbworker-replica")?;
        let started = (|| {
            own_dirs(&layout)?;
            let mut backup = layout.command("pg_basebackup");
            backup
                .arg("-D")
                .arg(&layout.data_dir)
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
                .args(["-h", "127.0.0.1", "-U", SERVER_USER, "-p"])
                .arg(self.port.to_string())
                .stdin(Stdio::null());
            run(&mut backup)?;
            let settings: Vec<&str> = self.settings.iter().map(String::as_str).collect();
            start_on_free_port(&layout, &settings)
        })();
        match started {
            Ok((port, pid)) => Ok(ThrowawayServer {
                admin_url: admin_url(port),
                layout,
                pid,
                port,
                settings: self.settings.clone(),
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&layout.base_dir);
                Err(e)
            }
        }
    }

    /// The URL of the maintenance database, `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// The data directory (e.g. to tell which file system the measurements ran on).
    pub fn data_dir(&self) -> &Path {
        &self.layout.data_dir
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Restarts the server as an operator would: a fast shutdown (every
    /// session is terminated), then a start on the same port with the same
    /// settings. Blocks until it accepts connections again.
    ///
    /// # Errors
    ///
    /// Whatever prevented the stop or the start.
    pub fn restart(&mut self) -> Result<(), Error> {
        let mut stop = self.layout.command("pg_ctl");
        stop.arg("stop")
            .arg("-D")
            .arg(&self.layout.data_dir)
            .args(["-m", "fast", "-w", "-t", "30"])
            .stdin(Stdio::null());
        run(&mut stop)?;
        let settings: Vec<&str> = self.settings.iter().map(String::as_str).collect();
        match start_postgres(&self.layout, self.port, &settings) {
            Ok(pid) => {
                self.pid = pid;
                Ok(())
            }
            Err(StartError::PortInUse(e) | StartError::Fatal(e)) => Err(e),
        }
    }
}

impl Drop for ThrowawayServer {
    fn drop(&mut self) {
        // Immediate: no shutdown checkpoint, the files are deleted next anyway.
        let mut stop = self.layout.command("pg_ctl");
        stop.arg("stop")
            .arg("-D")
            .arg(&self.layout.data_dir)
            .args(["-m", "immediate", "-w", "-t", "10"])
            .stdin(Stdio::null());
        if let Err(e) = run(&mut stop) {
            tracing::warn!(error = %e, pid = self.pid, "pg_ctl stop failed; killing the server");
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Err(e) = fs::remove_dir_all(&self.layout.base_dir) {
            tracing::warn!(error = %e, dir = %self.layout.base_dir.display(), "could not remove the throwaway cluster");
        }
    }
}
