//! Who runs the throwaway cluster: `initdb` and `postgres` refuse to run as root, so as root
//! the cluster is owned and run by the `postgres` system user.

use std::fs;
use std::process::{Command, Stdio};

use crate::Error;

/// The superuser of the throwaway cluster, and the OS user that runs it when we are root.
pub(crate) const SERVER_USER: &str = "postgres";

/// The uid and gid the cluster runs as, when we are root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// Whether this process's effective uid is 0, without `unsafe` (`geteuid`).
pub(crate) fn is_root() -> bool {
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
pub(crate) fn lookup_user(name: &str) -> Result<Owner, Error> {
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
}
