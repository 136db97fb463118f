//! Starting `postgres` and waiting until it accepts connections.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::Error;
use crate::layout::{Layout, describe};

/// How long the throwaway server may take to accept connections.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of the server log is put into error messages.
const LOG_TAIL_BYTES: u64 = 8 * 1024;

/// Settings every throwaway cluster gets.
const BASE_SETTINGS: [&str; 2] = ["listen_addresses=127.0.0.1", "max_connections=300"];

pub(crate) enum StartError {
    /// Another process grabbed the port: worth retrying with another one.
    PortInUse(Error),
    Fatal(Error),
}

/// Starts `postgres` on `port` and waits until it accepts connections; returns its pid.
pub(crate) fn start_postgres(
    layout: &Layout,
    port: u16,
    settings: &[&str],
) -> Result<u32, StartError> {
    let fatal = StartError::Fatal;
    let log_path = &layout.log_path;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(|e| fatal(Error::io(format!("opening {}", log_path.display()), e)))?;
    if let Some(owner) = layout.owner {
        // Only for tidiness: the server writes through the descriptor we hand it.
        let _ = chown(log_path, Some(owner.uid), Some(owner.gid));
    }
    let log_start = log
        .metadata()
        .map(|m| m.len())
        .map_err(|e| fatal(Error::io(format!("reading {}", log_path.display()), e)))?;
    let log_err = log
        .try_clone()
        .map_err(|e| fatal(Error::io(format!("duplicating {}", log_path.display()), e)))?;

    let mut cmd = layout.command("postgres");
    cmd.arg("-D")
        .arg(&layout.data_dir)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(&layout.socket_dir);
    // A later `-c` wins over an earlier one.
    for setting in BASE_SETTINGS.iter().chain(settings) {
        cmd.arg("-c").arg(setting);
    }
    // Never inherit our stdio: `cargo test` waits until every holder of its pipes is gone.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        // Its own process group, so that Ctrl-C on the test run does not race the watchdog.
        .process_group(0);

    let mut child = cmd
        .spawn()
        .map_err(|e| fatal(Error::io(format!("starting {}", describe(&cmd)), e)))?;
    let pid = child.id();

    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let log = read_log_tail(log_path, log_start);
                let port_taken = log.contains("already in use")
                    || log.contains("could not create any TCP/IP sockets");
                let error = Error::ServerExited { status, log };
                return Err(if port_taken {
                    StartError::PortInUse(error)
                } else {
                    StartError::Fatal(error)
                });
            }
            Ok(None) => {}
            Err(e) => {
                stop(&mut child);
                return Err(fatal(Error::io("waiting for postgres", e)));
            }
        }
        if is_ready(&layout.data_dir, port) {
            return Ok(pid);
        }
        if Instant::now() >= deadline {
            stop(&mut child);
            return Err(fatal(Error::Timeout {
                waited: START_TIMEOUT,
                log: read_log_tail(log_path, log_start),
            }));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the postmaster reports itself ready (what `pg_ctl start -w` checks) and accepts TCP
/// connections on `port`.
fn is_ready(data_dir: &Path, port: u16) -> bool {
    let Ok(pid_file) = fs::read_to_string(data_dir.join("postmaster.pid")) else {
        return false;
    };
    let lines: Vec<&str> = pid_file.lines().collect();
    // Line 4 is the port, line 8 the status.
    let port_ok = lines.get(3).is_some_and(|l| l.trim() == port.to_string());
    let status_ok = lines.get(7).is_some_and(|l| l.trim() == "ready");
    port_ok
        && status_ok
        && TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(1),
        )
        .is_ok()
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The last few KiB the server wrote to its log since `from`.
fn read_log_tail(path: &Path, from: u64) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::from("(no server log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = from.max(len.saturating_sub(LOG_TAIL_BYTES));
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::from("(server log unreadable)");
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Asks the kernel for a currently free TCP port on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the address of a bound socket", e))?
        .port();
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port().unwrap(), 0);
    }
}
