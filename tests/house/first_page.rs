//! The first code a newcomer reads stays short and free of plumbing: the
//! quickstart and dbworker's README example use the client, import at most
//! the prelude and serde, and hold no `Arc`, `CancellationToken`,
//! `tokio::join!` or `expect`; the quickstart is at most 40 code lines.

use std::path::Path;

/// Lines that are neither blank nor only a comment.
fn code_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect()
}

/// What the first page must not hold, named.
fn plumbing(code: &[&str]) -> Vec<String> {
    let banned = ["Arc", "CancellationToken", "join!", ".expect(", ".unwrap()"];
    let mut found = Vec::new();
    for line in code {
        for word in banned {
            if line.contains(word) {
                found.push(format!("{word:?} in `{line}`"));
            }
        }
        if line.starts_with("use ")
            && !line.starts_with("use dbworker::prelude::*")
            && !line.starts_with("use serde")
        {
            found.push(format!("an import beyond the prelude and serde: `{line}`"));
        }
    }
    found
}

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_quickstart_is_forty_code_lines_of_the_client_and_no_plumbing() {
    let text = read("examples/quickstart.rs");
    let code = code_lines(&text);
    assert!(
        code.len() <= 40,
        "the quickstart has {} code lines",
        code.len()
    );
    assert!(
        text.contains("Client::builder"),
        "the quickstart uses the client"
    );
    assert_eq!(plumbing(&code), Vec::<String>::new());
}

#[test]
fn the_readme_example_uses_the_client_and_no_plumbing() {
    let readme = read("dbworker/README.md");
    let start = readme.find("```rust").expect("a Rust example") + "```rust".len();
    let block = &readme[start..];
    let block = &block[block.find('\n').unwrap_or(0)..block.find("\n```").unwrap_or(block.len())];
    assert!(
        block.contains("Client::builder"),
        "the README uses the client"
    );
    let code: Vec<&str> = code_lines(block)
        .into_iter()
        // Its table's DDL comes from the ddl module: part of the set-up.
        .filter(|l| !l.starts_with("use dbworker::ddl"))
        .collect();
    assert_eq!(plumbing(&code), Vec::<String>::new());
}

#[test]
fn plumbing_is_found() {
    let code = ["use std::sync::Arc;", "let x = y.expect(\"z\");"];
    assert_eq!(plumbing(&code).len(), 3, "{:?}", plumbing(&code));
}
