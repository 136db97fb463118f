//! Running the `dbworker` binary against a test database, shared by the
//! command-line tests. Each test file uses what it needs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};

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

/// Starts `command` (a `dbworker ui …`) with its standard output piped and
/// returns it with the address its first line names (`dashboard on
/// http://ADDR/`); a dashboard listening on 0.0.0.0 is reached on 127.0.0.1.
pub(crate) fn serve_ui(mut command: Command) -> (Child, String) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .trim_start_matches("dashboard on http://")
        .trim_end_matches('/')
        .replace("0.0.0.0", "127.0.0.1");
    (child, addr)
}

/// `GET path` over plain HTTP/1.0 (with `auth` as its `Authorization`); the
/// whole response.
pub(crate) fn http_get(addr: &str, path: &str, auth: Option<&str>) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
