//! **No session state behind a transaction pooler.** docs/scaling.md
//! promises that dbworker keeps nothing on a server session past its
//! transaction, which is what lets PgBouncer in transaction mode hand the
//! session to another client: no session advisory lock (only the `_xact_`
//! ones), no temporary table, no plain or session `SET` (only `SET LOCAL`
//! and `set_config(…, true)`). This reads the library's statements and DDL
//! (the non-test `.rs` files of `dbworker/src/sql` and `dbworker/src/ddl`,
//! where the house keeps every statement) for the words that would break
//! it; the PgBouncer tests then show the rest at run time.

use std::fs;
use std::path::Path;

/// What holds state on a session past its transaction, lower-cased.
const SESSION_STATE: &[&str] = &[
    "pg_advisory_lock(",
    "pg_advisory_lock_shared(",
    "pg_try_advisory_lock(",
    "pg_try_advisory_lock_shared(",
    "create temp ",
    "create temporary ",
    "set session ",
];

/// The places in `text` (named `file`) that keep state on the session: a
/// word of [`SESSION_STATE`], or a `SET` statement without `LOCAL` at the
/// start of a string literal.
fn session_state(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let plain_set = ["\"set ", "'set "].iter().any(|start| {
            lower
                .match_indices(start)
                .any(|(i, _)| !lower[i + start.len()..].starts_with("local "))
        });
        if plain_set || SESSION_STATE.iter().any(|w| lower.contains(w)) {
            found.push(format!("{file}:{}: {}", n + 1, line.trim()));
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("a source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_library_keeps_no_session_state_past_a_transaction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("dbworker/src");
    let mut files = Vec::new();
    rust_files(&src.join("sql"), &mut files);
    rust_files(&src.join("ddl"), &mut files);
    assert!(files.len() > 20, "read {} files under {src:?}", files.len());
    let found: Vec<String> = files
        .iter()
        .filter(|p| !p.ends_with("tests.rs") && !p.to_string_lossy().ends_with("_tests.rs"))
        .flat_map(|p| session_state(&p.display().to_string(), &fs::read_to_string(p).unwrap()))
        .collect();
    assert!(found.is_empty(), "session state:\n{}", found.join("\n"));
}

#[test]
fn a_planted_session_lock_temp_table_or_plain_set_is_reported() {
    let planted = "let a = \"SELECT pg_advisory_lock(1)\";\n\
                   let b = \"CREATE TEMP TABLE t (x int)\";\n\
                   let c = \"SET statement_timeout = 0\";\n\
                   let d = \"SET LOCAL lock_timeout = '1s'\";\n\
                   let e = \"SELECT pg_advisory_xact_lock(1)\";\n";
    let found = session_state("planted.rs", planted);
    assert_eq!(
        found.iter().map(|f| &f[..12]).collect::<Vec<_>>(),
        ["planted.rs:1", "planted.rs:2", "planted.rs:3"],
        "{found:?}"
    );
}
