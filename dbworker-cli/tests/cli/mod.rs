//! Running the `dbworker` binary against a test database, shared by the
//! command-line tests. Each test file uses what it needs.
#![allow(dead_code)]

use std::process::{Command, Output};

use crate::common::Db;

/// `dbworker <args> --table jobs` against `db`.
pub(crate) fn dbworker(db: &Db, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", db.db.url())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The standard output of a command that must succeed.
pub(crate) fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The error output of a command that must fail.
pub(crate) fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}
