//! **The map names every file.** docs/architecture.md draws each crate's
//! `src/` as a block under `## <crate>/src`: a file at the left margin, a
//! folder as `name/` with its files indented two spaces below it. Every
//! source file (`.rs`, and the dashboard's `.js` and `.css`) must be on its
//! crate's map, and the map must name no file that is gone, so the map a
//! newcomer reads is the house as it stands.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The crates the map draws.
const MAPPED: [&str; 5] = [
    "workerutil",
    "dbworker",
    "dbworker-cli",
    "testkit",
    "models",
];

/// Whether `name` is a file the map lists.
fn is_source(name: &str) -> bool {
    [".rs", ".js", ".css"].iter().any(|ext| name.ends_with(ext))
}

/// The files the map lists for `krate`, as paths under its `src/`.
pub(crate) fn listed(doc: &str, krate: &str) -> BTreeSet<String> {
    let heading = format!("## {krate}/src");
    let start = doc
        .lines()
        .position(|l| l.starts_with(&heading))
        .unwrap_or_else(|| panic!("docs/architecture.md has no `{heading}` section"));
    let mut lines = doc.lines().skip(start + 1);
    lines
        .by_ref()
        .find(|l| l.starts_with("```"))
        .unwrap_or_else(|| panic!("`{heading}` has no code block"));
    let mut out = BTreeSet::new();
    let mut folder = String::new();
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let Some(token) = line.split_whitespace().next() else {
            continue;
        };
        let indented = line.starts_with("  ") && !line.starts_with("   ");
        if !line.starts_with(' ') {
            folder = if token.ends_with('/') {
                token.to_owned()
            } else {
                String::new()
            };
            if is_source(token) {
                out.insert(token.to_owned());
            }
        } else if indented && is_source(token) {
            out.insert(format!("{folder}{token}"));
        }
    }
    out
}

/// The source files under `dir`, as paths relative to it.
fn on_disk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            // Snapshots are data, one .sql file per statement, not code.
            if name != "snapshots" {
                on_disk(&entry.path(), &format!("{prefix}{name}/"), out);
            }
        } else if is_source(&name) {
            out.insert(format!("{prefix}{name}"));
        }
    }
}

#[test]
fn the_architecture_map_names_every_source_file_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut wrong = Vec::new();
    for krate in MAPPED {
        let listed = listed(&doc, krate);
        let mut actual = BTreeSet::new();
        on_disk(&root.join(krate).join("src"), "", &mut actual);
        for missing in actual.difference(&listed) {
            wrong.push(format!("{krate}/src/{missing} is not on the map"));
        }
        for gone in listed.difference(&actual) {
            wrong.push(format!("{krate}/src/{gone} is on the map but gone"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_map_reader_takes_margin_files_and_indented_folder_files() {
    let doc = "## k/src — x\n\n```\nlib.rs    the roof\n── a floor\nsql/      statements\n  a.rs    one\n           a continued description naming b.rs\n  snapshots/  data\nz.rs      last\n```\n";
    let got: Vec<String> = listed(doc, "k").into_iter().collect();
    assert_eq!(got, ["lib.rs", "sql/a.rs", "z.rs"]);
}
