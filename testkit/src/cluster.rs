//! Creating a throwaway cluster: its directory (watched by the watchdog), `initdb`, and the
//! first start on a free port.

use std::fs;
use std::os::unix::fs::chown;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::layout::{Layout, run};
use crate::owner::{SERVER_USER, is_root, lookup_user};
use crate::postmaster::{START_TIMEOUT, StartError, free_port, start_postgres};
use crate::process_tag::process_tag;
use crate::watchdog::spawn_watchdog;
use crate::{Error, find_pg_bin_dir};

/// How many ports are tried when the server cannot bind the one picked.
const START_ATTEMPTS: usize = 3;

/// The maintenance database of a throwaway cluster listening on `port`.
pub(crate) fn admin_url(port: u16) -> String {
    format!("postgres://{SERVER_USER}@127.0.0.1:{port}/postgres")
}

/// Finds the binaries and the server user, and creates a fresh temporary directory
/// `<prefix>-<pid>-<tag>[-<n>]` watched by a watchdog that removes it (and stops any server in
/// it) once this process has exited.
pub(crate) fn prepare_cluster_dir(prefix: &str) -> Result<Layout, Error> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let bin_dir = find_pg_bin_dir()?;
    let owner = if is_root() {
        Some(lookup_user(SERVER_USER)?)
    } else {
        None
    };

    let mut name = format!("{prefix}-{}-{}", std::process::id(), process_tag());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    if n > 0 {
        name.push_str(&format!("-{n}"));
    }
    let base_dir = std::env::temp_dir().join(name);
    // Leftover from an earlier process with the same pid and tag: practically impossible,
    // but harmless to clear.
    let _ = fs::remove_dir_all(&base_dir);
    fs::create_dir_all(&base_dir)
        .map_err(|e| Error::io(format!("creating {}", base_dir.display()), e))?;

    // From here on the directory (and any server in it) must go away when we exit.
    if let Err(e) = spawn_watchdog(&base_dir) {
        let _ = fs::remove_dir_all(&base_dir);
        return Err(e);
    }
    Ok(Layout::new(bin_dir, base_dir, owner))
}

/// Runs initdb and starts the server with `postmaster::BASE_SETTINGS` and `settings`; returns
/// its port and pid.
pub(crate) fn init_and_start(layout: &Layout, settings: &[&str]) -> Result<(u16, u32), Error> {
    own_dirs(layout)?;
    let started = Instant::now();
    let mut initdb = layout.command("initdb");
    initdb
        .arg("-D")
        .arg(&layout.data_dir)
        .args([
            "-A",
            "trust",
            "-U",
            SERVER_USER,
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .stdin(Stdio::null());
    run(&mut initdb)?;
    tracing::debug!(elapsed = ?started.elapsed(), "initdb finished");
    start_on_free_port(layout, settings)
}

/// Creates the socket directory and hands it and the base directory to the
/// server user (when we are root), so its binaries may write there.
pub(crate) fn own_dirs(layout: &Layout) -> Result<(), Error> {
    fs::create_dir_all(&layout.socket_dir)
        .map_err(|e| Error::io(format!("creating {}", layout.socket_dir.display()), e))?;
    if let Some(owner) = layout.owner {
        for dir in [&layout.base_dir, &layout.socket_dir] {
            chown(dir, Some(owner.uid), Some(owner.gid)).map_err(|e| {
                Error::io(
                    format!("changing the owner of {} to {SERVER_USER}", dir.display()),
                    e,
                )
            })?;
        }
    }
    Ok(())
}

/// Starts the cluster in `layout` on a free port, trying another when one is
/// taken meanwhile; returns its port and pid.
pub(crate) fn start_on_free_port(layout: &Layout, settings: &[&str]) -> Result<(u16, u32), Error> {
    let mut last_error = None;
    for attempt in 1..=START_ATTEMPTS {
        let port = free_port()?;
        let started = Instant::now();
        match start_postgres(layout, port, settings) {
            Ok(pid) => {
                tracing::debug!(port, elapsed = ?started.elapsed(), "throwaway PostgreSQL ready");
                return Ok((port, pid));
            }
            Err(StartError::PortInUse(e)) => {
                tracing::debug!(port, attempt, "port taken, retrying with another one");
                last_error = Some(e);
            }
            Err(StartError::Fatal(e)) => return Err(e),
        }
    }
    Err(last_error.unwrap_or_else(|| Error::Timeout {
        waited: START_TIMEOUT,
        log: String::new(),
    }))
}
