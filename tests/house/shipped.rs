//! What ships in each published crate: its README.md and the workspace's two
//! license files (copies, since a package holds only its own folder), and
//! no relative link.
//!
//! No relative link in what ships: the published crates' Markdown files (the
//! guide and the operations manual that `dbworker` includes as its docs, each
//! crate's README) and the doc comments of their Rust files render on docs.rs
//! and crates.io, where a link to `state-machine.md` or `../docs/x.md` leads
//! nowhere. A link there is an absolute URL (`https://…`, `mailto:`), a
//! fragment of the same page (`#…`), or an intra-doc path (`crate::operations`,
//! `crate::DbStore#…`, `workerutil::Worker`), which has neither `/` nor `.`.
//! Code (fenced blocks and `inline spans`) is skipped.

use std::fs;
use std::path::{Path, PathBuf};

/// The folders of the crates that are published, relative to the workspace.
pub(crate) const PUBLISHED: [&str; 4] = ["workerutil", "dbworker", "dbworker-cli", "testkit"];

/// A link that would not resolve once the file is outside the repository.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RelativeLink {
    pub(crate) file: PathBuf,
    pub(crate) line: usize,
    pub(crate) target: String,
}

impl std::fmt::Display for RelativeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: relative link `{}` (ships in the package; use an intra-doc link or an absolute URL)",
            self.file.display(),
            self.line,
            self.target
        )
    }
}

/// Every relative link in the Markdown files and Rust doc comments under
/// `crate_dir` (its `target/` aside).
pub(crate) fn relative_links(crate_dir: &Path) -> Vec<RelativeLink> {
    let mut found = Vec::new();
    for file in files(crate_dir) {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let is_md = file.extension().is_some_and(|e| e == "md");
        let is_rs = file.extension().is_some_and(|e| e == "rs");
        if !is_md && !is_rs {
            continue;
        }
        let mut fenced = false;
        for (n, raw) in text.lines().enumerate() {
            let line = if is_rs {
                let t = raw.trim_start();
                match t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) {
                    Some(doc) => doc,
                    None => continue,
                }
            } else {
                raw
            };
            let t = line.trim_start();
            if t.starts_with("```") || t.starts_with("~~~") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            for target in link_targets(&without_code_spans(line)) {
                if is_relative(&target) {
                    found.push(RelativeLink {
                        file: file.clone(),
                        line: n + 1,
                        target,
                    });
                }
            }
        }
    }
    found
}

/// Files under `dir`, sorted, without `target/` and hidden folders.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                out.extend(files(&path));
            }
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// `line` with every `code span` blanked.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for ch in line.chars() {
        if ch == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if !in_code {
            out.push(ch);
        }
    }
    out
}

/// The targets of inline links `[text](target)`, reference definitions
/// `[label]: target` and HTML `href="…"`/`src="…"` on one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find([')', ' ']).unwrap_or(after.len());
        out.push(after[..end].trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    let t = line.trim_start();
    if t.starts_with('[')
        && let Some(i) = t.find("]: ")
        && let Some(target) = t[i + 3..].split_whitespace().next()
    {
        out.push(target.to_owned());
    }
    for attr in ["href=\"", "src=\""] {
        let mut rest = line;
        while let Some(i) = rest.find(attr) {
            let after = &rest[i + attr.len()..];
            let end = after.find('"').unwrap_or(after.len());
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// Whether `target` is a path to a file rather than a URL, a fragment or an
/// intra-doc path.
fn is_relative(target: &str) -> bool {
    if target.is_empty()
        || target.starts_with('#')
        || ["https://", "http://", "mailto:"]
            .iter()
            .any(|scheme| target.starts_with(scheme))
    {
        return false;
    }
    let path = target.split('#').next().unwrap_or(target);
    path.contains('/') || path.contains('.')
}

#[test]
fn no_relative_link_ships_in_a_published_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for name in PUBLISHED {
        let dir = root.join(name);
        assert!(
            dir.join("Cargo.toml").exists(),
            "{} is a crate",
            dir.display()
        );
        all.extend(relative_links(&dir));
    }
    let report: Vec<String> = all.iter().map(|l| l.to_string()).collect();
    assert!(
        report.is_empty(),
        "links that 404 on docs.rs or crates.io:\n{}",
        report.join("\n")
    );
}

#[test]
fn every_published_crate_has_a_readme_and_the_workspaces_license_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in PUBLISHED {
        let dir = root.join(name);
        assert!(
            dir.join("README.md").is_file(),
            "{name}/README.md: every published crate has a README (crates.io shows it)"
        );
        for license in ["LICENSE-MIT", "LICENSE-APACHE"] {
            let original = fs::read_to_string(root.join(license)).expect("the workspace's license");
            let copy = fs::read_to_string(dir.join(license)).unwrap_or_default();
            assert!(
                copy == original,
                "{name}/{license} is missing or differs from the workspace's: cp {license} {name}/"
            );
        }
    }
}

#[test]
fn the_link_check_reports_each_planted_relative_link_and_nothing_else() {
    let c = crate::Planted::new("links");
    c.write(
        "docs/guide.md",
        "See [the states](state-machine.md) and [ops](../docs/operations.md#vacuum).\n\
         Fine: [ops](crate::operations#vacuum), [store](crate::DbStore), [here](#top),\n\
         [repo](https://github.com/dbworker/dbworker/blob/main/docs/x.md), `[code](a.md)`.\n\
         ```rust\nlet v = a[i](b.md);\n```\n\
         [label]: ../README.md\n<img src=\"docs/chart.svg\">\n",
    );
    c.write(
        "src/lib.rs",
        "//! Crate docs: [guide](docs/guide.md), [worker](workerutil::Worker).\n\
         // not a doc comment: [x](y.md)\n\
         /// An item: [fn](Self::f()), [mail](mailto:a@b.c).\n\
         pub struct S;\n",
    );
    let found = relative_links(&c.0);
    let got: Vec<(String, usize, &str)> = found
        .iter()
        .map(|l| {
            let rel = l.file.strip_prefix(&c.0).unwrap().display().to_string();
            (rel, l.line, l.target.as_str())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("docs/guide.md".to_owned(), 1, "state-machine.md"),
            (
                "docs/guide.md".to_owned(),
                1,
                "../docs/operations.md#vacuum"
            ),
            ("docs/guide.md".to_owned(), 7, "../README.md"),
            ("docs/guide.md".to_owned(), 8, "docs/chart.svg"),
            ("src/lib.rs".to_owned(), 1, "docs/guide.md"),
        ],
        "{found:#?}"
    );
    assert!(
        found[0]
            .to_string()
            .contains("guide.md:1: relative link `state-machine.md`")
    );
}
