//! **A cited test exists.** docs/guarantees.md holds each promise by the
//! tests and models that check it, cited as `` `file.rs::name` `` (later ones
//! of the same file as `` `…::name` ``), and the guide and the operations
//! manual cite tests the same way. A test renamed or removed would leave a
//! promise held by nothing while the page still says it is: each cited name
//! must be a `fn` of the workspace (test code included), and each cited file
//! a file of it.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The pages whose citations are checked.
const PAGES: [&str; 3] = [
    "docs/guarantees.md",
    "dbworker/docs/guide.md",
    "dbworker/docs/operations.md",
];

/// The `(file, name)` each citation of `doc` names: the file is `None` for a
/// `…::name` citation (it reuses the one before it).
pub(crate) fn citations(doc: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        let Some((file, name)) = quoted.rsplit_once("::") else {
            continue;
        };
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !is_name {
            continue;
        }
        if file == "…" {
            out.push((None, name.to_owned()));
        } else if let Some(file) = file.strip_suffix(".rs")
            && !file.contains([' ', ':', '(', '<'])
        {
            out.push((Some(format!("{file}.rs")), name.to_owned()));
        }
    }
    out
}

/// Every `fn` name and every `.rs` path (relative to `root`) under `root`,
/// leaving out build output and version control.
pub(crate) fn workspace(root: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut fns, mut files) = (BTreeSet::new(), BTreeSet::new());
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    dirs.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap_or(&path);
            files.insert(rel.to_string_lossy().replace('\\', "/"));
            let text = fs::read_to_string(&path).unwrap_or_default();
            let mut words = text.split(|c: char| !(c.is_alphanumeric() || c == '_'));
            while let Some(word) = words.next() {
                if word == "fn"
                    && let Some(name) = words.find(|w| !w.is_empty())
                {
                    fns.insert(name.to_owned());
                }
            }
        }
    }
    (fns, files)
}

/// The citations of `doc` (named `page`) that name no `fn` in `fns` or no
/// file in `files` (a cited file matches a path ending with it).
pub(crate) fn dangling(
    page: &str,
    doc: &str,
    fns: &BTreeSet<String>,
    files: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (file, name) in citations(doc) {
        if !fns.contains(&name) {
            let at = file.as_deref().unwrap_or("…");
            out.push(format!("{page}: `{at}::{name}` names no function"));
        }
        if let Some(file) = file {
            let found = files
                .iter()
                .any(|f| f == &file || f.ends_with(&format!("/{file}")));
            if !found {
                out.push(format!("{page}: `{file}::{name}`: no file {file}"));
            }
        }
    }
    out
}

#[test]
fn every_test_the_docs_cite_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (fns, files) = workspace(root);
    let mut all = Vec::new();
    let mut cited = 0;
    for page in PAGES {
        let doc = fs::read_to_string(root.join(page)).expect("read a page");
        cited += citations(&doc).len();
        all.extend(dangling(page, &doc, &fns, &files));
    }
    // The reading finds the citations at all (guarantees.md alone has hundreds).
    assert!(cited > 300, "only {cited} citations read");
    assert!(
        all.is_empty(),
        "cited tests that do not exist:\n{}",
        all.join("\n")
    );
}

#[test]
fn a_renamed_test_or_a_moved_file_is_reported_by_its_citation() {
    let fns: BTreeSet<String> = ["kept", "also_kept"].map(String::from).into();
    let files: BTreeSet<String> = ["dbworker/tests/jobs/a.rs".to_owned()].into();
    let doc = "| promise | `a.rs::kept`, `…::also_kept`, `…::renamed`; `b.rs::kept`; \
               `sql::tests::kept`, `Store::open`, `crate::x::y()` |";
    assert_eq!(
        dangling("p.md", doc, &fns, &files),
        [
            "p.md: `…::renamed` names no function",
            "p.md: `b.rs::kept`: no file b.rs",
        ]
    );
    assert!(dangling("p.md", "`a.rs::kept`", &fns, &files).is_empty());
}
