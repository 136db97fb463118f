//! The process-wide PostgreSQL server: `DATABASE_URL`, or a throwaway cluster.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, find_pg_bin_dir, url};

/// How long the throwaway server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports are tried when the server cannot bind the one picked.
const START_ATTEMPTS: usize = 3;
/// The superuser of the throwaway cluster, and the OS user that runs it when we are root.
const SERVER_USER: &str = "postgres";
/// How much of the server log is put into error messages.
const LOG_TAIL_BYTES: u64 = 8 * 1024;

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
            url::with_database(&given, "x").map_err(|reason| Error::InvalidUrl {
                url: url::redact(&given),
                reason,
            })?;
            Ok(Server {
                admin_url: given,
                cluster: None,
            })
        }
        _ => start_throwaway(),
    }
}

/// The uid and gid the cluster runs as, when we are root.
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// Settings every throwaway cluster gets.
const BASE_SETTINGS: [&str; 2] = ["listen_addresses=127.0.0.1", "max_connections=300"];

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

fn admin_url(port: u16) -> String {
    format!("postgres://{SERVER_USER}@127.0.0.1:{port}/postgres")
}

/// Finds the binaries and the server user, and creates a fresh temporary directory
/// `<prefix>-<pid>-<tag>[-<n>]` watched by a watchdog that removes it (and stops any server in
/// it) once this process has exited.
fn prepare_cluster_dir(prefix: &str) -> Result<Layout, Error> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let bin_dir = find_pg_bin_dir()?;
    let owner = if is_root() {
        Some(lookup_user(SERVER_USER)?)
    } else {
        None
    };

    let mut name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        crate::database::process_tag()
    );
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

/// A throwaway cluster with settings of the caller's choosing, owned by this value: stopped
/// and deleted when it is dropped (and, should the process die first, by the same watchdog
/// that cleans up after the shared test cluster).
///
/// Unlike the process-wide [`server`] (tuned for test speed, with `fsync=off`), nothing is
/// traded for speed unless asked: the server runs with PostgreSQL's defaults plus
/// `listen_addresses=127.0.0.1`, `max_connections=300` and the given settings (which win).
/// Use it for measurements that must run with durable settings.
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

/// Where the pieces of a throwaway cluster live, and who runs it.
#[derive(Debug)]
struct Layout {
    bin_dir: PathBuf,
    base_dir: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    /// The user to run the server binaries as (when we are root).
    owner: Option<Owner>,
}

impl Layout {
    fn new(bin_dir: PathBuf, base_dir: PathBuf, owner: Option<Owner>) -> Self {
        Layout {
            bin_dir,
            data_dir: base_dir.join("data"),
            socket_dir: base_dir.join("sock"),
            log_path: base_dir.join("postgres.log"),
            base_dir,
            owner,
        }
    }

    /// A command for one of the server binaries, run as the owner if there is one.
    fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(name));
        // The server user may not be allowed into our working directory.
        cmd.current_dir(&self.base_dir);
        for var in [
            "PGDATA",
            "PGPORT",
            "PGHOST",
            "PGUSER",
            "PGDATABASE",
            "PGOPTIONS",
        ] {
            cmd.env_remove(var);
        }
        if let Some(owner) = self.owner {
            cmd.uid(owner.uid).gid(owner.gid);
        }
        cmd
    }
}

/// Runs initdb and starts the server with [`BASE_SETTINGS`] and `settings`; returns its port
/// and pid.
fn init_and_start(layout: &Layout, settings: &[&str]) -> Result<(u16, u32), Error> {
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

enum StartError {
    /// Another process grabbed the port: worth retrying with another one.
    PortInUse(Error),
    Fatal(Error),
}

/// Starts `postgres` on `port` and waits until it accepts connections; returns its pid.
fn start_postgres(layout: &Layout, port: u16, settings: &[&str]) -> Result<u32, StartError> {
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

/// The watchdog: waits for this process to end, then stops the server immediately
/// (SIGQUIT to the postmaster, SIGKILL if it lingers) and deletes the directory.
const WATCHDOG_SCRIPT: &str = r#"
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  # An exited process nobody has reaped yet still answers kill -0.
  ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
while alive "$1"; do sleep 0.5; done
pidfile="$2/data/postmaster.pid"
if [ -f "$pidfile" ]; then
  pg=$(head -n 1 "$pidfile")
  case "$pg" in
    ''|*[!0-9]*) ;;
    *)
      kill -QUIT "$pg" 2>/dev/null
      i=0
      while alive "$pg" && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
      kill -KILL "$pg" 2>/dev/null
      ;;
  esac
fi
rm -rf "$2"
"#;

fn spawn_watchdog(base_dir: &Path) -> Result<(), Error> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("dbworker-testkit-watchdog")
        .arg(std::process::id().to_string())
        .arg(base_dir)
        // Must not hold our stdout/stderr open, or `cargo test` would wait for it.
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of our process group, so that Ctrl-C on the test run does not kill it.
        .process_group(0);
    cmd.spawn()
        .map_err(|e| Error::io("starting the clean-up watchdog (sh)", e))?;
    // The child is deliberately neither waited for nor killed: it outlives us.
    Ok(())
}

fn describe(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        out.push(' ');
        out.push_str(&arg.to_string_lossy());
    }
    out
}

/// Runs `cmd` to completion, capturing its output; fails unless it exits successfully.
fn run(cmd: &mut Command) -> Result<(), Error> {
    let output = cmd
        .output()
        .map_err(|e| Error::io(format!("running {}", describe(cmd)), e))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !stdout.trim().is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&stdout);
    }
    Err(Error::Command {
        command: describe(cmd),
        status: output.status,
        output: text,
    })
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
fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the address of a bound socket", e))?
        .port();
    Ok(port)
}

/// Whether this process's effective uid is 0, without `unsafe` (`geteuid`).
fn is_root() -> bool {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        // "Uid:\t<real>\t<effective>\t<saved>\t<fs>"
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:"))
            && let Some(euid) = line.split_whitespace().nth(2)
        {
            return euid == "0";
        }
    }
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Looks `name` up in /etc/passwd.
fn lookup_user(name: &str) -> Result<Owner, Error> {
    let passwd =
        fs::read_to_string("/etc/passwd").map_err(|e| Error::io("reading /etc/passwd", e))?;
    parse_passwd(&passwd, name).ok_or_else(|| Error::NoServerUser {
        user: name.to_owned(),
    })
}

fn parse_passwd(passwd: &str, name: &str) -> Option<Owner> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(Owner { uid, gid })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      postgresx:x:7:7::/:/bin/sh\n\
                      postgres:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n";
        let owner = parse_passwd(passwd, "postgres").unwrap();
        assert_eq!((owner.uid, owner.gid), (101, 104));
        assert!(parse_passwd(passwd, "nobody").is_none());
    }

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port().unwrap(), 0);
    }
}
