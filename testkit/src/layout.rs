//! Where the pieces of a throwaway cluster live, and how its binaries are run.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::Error;
use crate::owner::Owner;

/// Where the pieces of a throwaway cluster live, and who runs it.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) bin_dir: PathBuf,
    pub(crate) base_dir: PathBuf,
    pub(crate) data_dir: PathBuf,
    pub(crate) socket_dir: PathBuf,
    pub(crate) log_path: PathBuf,
    /// The user to run the server binaries as (when we are root).
    pub(crate) owner: Option<Owner>,
}

impl Layout {
    pub(crate) fn new(bin_dir: PathBuf, base_dir: PathBuf, owner: Option<Owner>) -> Self {
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
    pub(crate) fn command(&self, name: &str) -> Command {
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

pub(crate) fn describe(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        out.push(' ');
        out.push_str(&arg.to_string_lossy());
    }
    out
}

/// Runs `cmd` to completion, capturing its output; fails unless it exits successfully.
pub(crate) fn run(cmd: &mut Command) -> Result<(), Error> {
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
