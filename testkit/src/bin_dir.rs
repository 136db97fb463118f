//! Locating the PostgreSQL server binaries.

use std::env;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// The binaries a directory must contain to count as a server binaries directory.
const REQUIRED: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Finds the PostgreSQL server binaries directory (the one containing `initdb`, `pg_ctl` and
/// `postgres`).
///
/// Looks, in this order, at:
/// 1. every directory on `PATH` (if the binaries there are symbolic links into a directory that
///    itself holds all three, that real directory is returned instead);
/// 2. the directory printed by `pg_config --bindir`;
/// 3. `/usr/lib/postgresql/<major>/bin` (Debian/Ubuntu), highest major version first;
/// 4. `/usr/pgsql-<major>/bin` (RHEL/Fedora PGDG packages), highest first;
/// 5. `/usr/local/pgsql/bin` (source installs);
/// 6. `/opt/homebrew/opt/postgresql*/bin` and `/usr/local/opt/postgresql*/bin` (Homebrew).
///
/// # Errors
///
/// [`Error::BinariesNotFound`] listing every directory looked at.
pub fn find_pg_bin_dir() -> Result<PathBuf, Error> {
    let mut searched = Vec::new();

    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            if dir.as_os_str().is_empty() {
                continue;
            }
            if has_server_binaries(&dir) {
                return Ok(prefer_real_dir(dir));
            }
            searched.push(dir);
        }
    }

    if let Some(dir) = pg_config_bindir() {
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }

    let mut candidates = Vec::new();
    candidates.extend(
        versioned_children(Path::new("/usr/lib/postgresql"), "")
            .into_iter()
            .map(|d| d.join("bin")),
    );
    candidates.extend(
        versioned_children(Path::new("/usr"), "pgsql-")
            .into_iter()
            .map(|d| d.join("bin")),
    );
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    for brew in ["/opt/homebrew/opt", "/usr/local/opt"] {
        candidates.extend(
            versioned_children(Path::new(brew), "postgresql")
                .into_iter()
                .map(|d| d.join("bin")),
        );
    }

    for dir in candidates {
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }

    Err(Error::BinariesNotFound { searched })
}

/// Whether `dir` holds executable `initdb`, `pg_ctl` and `postgres`.
fn has_server_binaries(dir: &Path) -> bool {
    REQUIRED.iter().all(|name| is_executable(&dir.join(name)))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// For a `PATH` entry such as `/usr/local/bin` whose `initdb` links into
/// `/usr/lib/postgresql/15/bin`, returns the latter when it holds all binaries.
fn prefer_real_dir(dir: PathBuf) -> PathBuf {
    let real = fs::canonicalize(dir.join("initdb"))
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    match real {
        Some(real) if real != dir && has_server_binaries(&real) => real,
        _ => dir,
    }
}

/// Runs `pg_config --bindir` if `pg_config` can be run.
fn pg_config_bindir() -> Option<PathBuf> {
    let output = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| PathBuf::from(text))
}

/// The children of `parent` whose names start with `prefix`, highest version number first.
fn versioned_children(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let rest = name.strip_prefix(prefix)?;
            Some((version_key(rest), entry.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.into_iter().map(|(_, path)| path).collect()
}

/// The numbers in `s`, in order: `"@15"` → `[15]`, `"9.6"` → `[9, 6]`.
fn version_key(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .filter_map(|part| part.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_keys_order_numerically() {
        assert_eq!(version_key("15"), vec![15]);
        assert_eq!(version_key("@9.6"), vec![9, 6]);
        assert!(version_key("16") > version_key("9.6"));
        assert!(version_key("@17") > version_key(""));
    }

    #[test]
    fn versioned_children_sorts_highest_first() {
        let dir = env::temp_dir().join(format!("dbworker-testkit-vc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for name in ["9.6", "15", "10", "other"] {
            fs::create_dir_all(dir.join(name)).unwrap();
        }
        let found = versioned_children(&dir, "");
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, vec!["15", "10", "9.6", "other"]);
    }
}
