//! The watchdog that stops and deletes throwaway clusters once this process has exited,
//! however it exits.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;

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

pub(crate) fn spawn_watchdog(base_dir: &Path) -> Result<(), Error> {
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
