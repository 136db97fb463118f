//! The house's rules, checked by `cargo test` on every crate of the workspace
//! (`workerutil`, `dbworker`, `dbworker-cli`, `testkit`, `models`; not the
//! benchmark in `bench/`, a tool kept as it was under examples/); see "The
//! rules of the house" in docs/architecture.md.
//!
//! - **Arrows only go down: no cycle between top-level modules.** A top-level
//!   module `a` is the file `src/a.rs` or the folder `src/a/` (a folder is one
//!   room: uses inside it are not counted). `a` uses `b` when non-test code
//!   under `src/a` names `crate::b`: in `use crate::b…`, `use crate::{b, …}`,
//!   a path `crate::b::x` in code, or a `super::`/`self::` path that resolves
//!   out of `a` into `b`. The roof (`lib.rs`, `main.rs`) and `src/bin/` are
//!   not counted. A cycle (`a` uses `b` uses … uses `a`) fails, named with the
//!   file and line of each arrow.
//! - **No sibling named like a top-level module through `super::`.** Inside a
//!   folder, `super::cluster::now` may name the folder's `cluster` or read as
//!   the top-level `cluster`; write `crate::<folder>::cluster::now`, so the
//!   path says which (a text reader once saw a cycle through such paths).
//! - **The ground floor** of `dbworker` (`error`, `message`, `retry`,
//!   `metrics`, `columns`, `job_filter`, `sql`) uses no module above it.
//! - **600 lines at most** in every non-test source file: every `.rs` file
//!   under `src/` except files named `tests.rs` or `*_tests.rs` and files
//!   under a `tests/` folder.
//! - **The library pulls in no tool**: the `[dependencies]` of `workerutil`
//!   and `dbworker` name none of clap, indicatif, ratatui, tracing-subscriber.
//! - **What ships is whole** (`shipped.rs`): no relative link in a published
//!   crate's Markdown files or doc comments (they render on docs.rs and
//!   crates.io), and each published crate has a README.md and copies of the
//!   workspace's LICENSE-MIT and LICENSE-APACHE.
//!
//! - **The map names every file** (`map.rs`): docs/architecture.md lists
//!   every source file of each crate, and no file that is gone.
//!
//! - **The first page stays short** (`first_page.rs`): the quickstart is at
//!   most 40 code lines of the client, and it and dbworker's README example
//!   hold no `Arc`, `CancellationToken`, `join!`, `expect` or `unwrap`.
//!
//! - **The public API is on record** (`public_api.rs`): each library's public
//!   API, read from its sources, matches its `public-api.txt`, and no public
//!   item is at two paths but those listed in `public_api_aliases.txt`.
//!
//! - **A cited test exists** (`cited_tests.rs`): every test or model that
//!   docs/guarantees.md, the guide or the operations manual cites as
//!   `file.rs::name` is a function of the workspace, in a file of that name.
//!
//! - **No session state** (`session_state.rs`): no statement or DDL of
//!   `dbworker` takes a session advisory lock, makes a temporary table or
//!   sets a setting past its transaction (docs/scaling.md's promise behind a
//!   transaction pooler).
//!
//! Test code is left out of the graph: `#[cfg(test)]` items (a `mod tests
//! { … }`, a function, a `use`), files under `#![cfg(test)]`, and the test
//! files named above. The checker reads text, not the compiler's view:
//! comments and string literals are skipped, and a use through the roof's
//! re-exports (`crate::Name`) is not seen. Its self-tests plant each fault in
//! a crate in a temporary directory and check that it is reported by name.

mod budget_doc;
mod check;
mod cited_tests;
mod first_page;
mod map;
mod public_api;
mod scan;
mod session_state;
mod shipped;

use std::fs;
use std::path::{Path, PathBuf};

use check::{Extra, Violation, check_crate};

/// The crates and what each is held to beyond the common rules.
const CRATES: [(&str, Extra<'static>); 5] = [
    (
        "workerutil",
        Extra {
            ground_floor: &[],
            no_tools: TOOLS,
        },
    ),
    (
        "dbworker",
        Extra {
            ground_floor: &[
                "error",
                "message",
                "retry",
                "metrics",
                "columns",
                "job_filter",
                "sql",
            ],
            no_tools: TOOLS,
        },
    ),
    ("dbworker-cli", NONE),
    ("testkit", NONE),
    ("models", NONE),
];

/// What an application embedding the library must not compile.
const TOOLS: &[&str] = &["clap", "indicatif", "ratatui", "tracing-subscriber"];

const NONE: Extra<'static> = Extra {
    ground_floor: &[],
    no_tools: &[],
};

#[test]
fn every_crate_keeps_the_house_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for (name, extra) in CRATES {
        let (graph, violations) = check_crate(&root.join(name), extra);
        println!(
            "# {name}: {} top-level modules\n{}",
            graph.len(),
            check::describe(&graph)
        );
        all.extend(violations);
    }
    let report: Vec<String> = all.iter().map(|v| v.to_string()).collect();
    assert!(
        report.is_empty(),
        "the house's rules are broken:\n{}",
        report.join("\n")
    );
}

/// A crate written into a fresh temporary directory, removed when dropped.
struct Planted(PathBuf);

impl Planted {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("dbworker-house-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src")).expect("create the planted crate");
        Self(dir)
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.0.join(rel);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create a folder");
        fs::write(&path, text).expect("write a planted file");
    }

    fn remove(&self, rel: &str) {
        fs::remove_file(self.0.join(rel)).expect("remove a planted file");
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn lines(n: usize) -> String {
    (0..n).map(|i| format!("// line {i}\n")).collect()
}

#[test]
fn the_checker_reports_a_planted_cycle_and_a_long_file_by_name_then_passes() {
    let c = Planted::new("cycle");
    c.write("src/lib.rs", "mod a;\nmod b;\nmod big;\nmod c;\nmod sql;\n");
    c.write(
        "src/a.rs",
        "use crate::{b::B, c::C};\npub(crate) struct A;\n",
    );
    c.write("src/b/mod.rs", "mod inner;\npub(crate) struct B;\n");
    // leaves b through `super::super`: b uses a, and a uses b
    c.write("src/b/inner.rs", "use super::super::a::A;\nuse super::B;\n");
    // c names a only in a comment, a string and test code: no arrow c -> a
    c.write(
        "src/c.rs",
        "// crate::a::A\npub(crate) struct C;\nconst S: &str = \"crate::a\";\n\
         #[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
    );
    c.write("src/big.rs", &lines(601));
    // test files may be long
    c.write("src/sql/tests.rs", &lines(700));
    c.write("src/sql/long_tests.rs", &lines(700));
    c.write("src/sql/tests/cases.rs", &lines(700));

    let (graph, found) = check_crate(&c.0, Extra::default());
    let report: Vec<String> = found.iter().map(|v| v.to_string()).collect();
    assert_eq!(found.len(), 2, "{report:#?}\n{}", check::describe(&graph));
    assert!(
        found
            .iter()
            .any(|v| matches!(v, Violation::Cycle { modules, .. } if modules == &["a", "b"])),
        "{report:#?}"
    );
    assert!(
        report
            .iter()
            .any(|r| r.contains("a -> b") && r.contains("b -> a") && r.contains("inner.rs:1")),
        "{report:#?}"
    );
    assert!(
        found.iter().any(
            |v| matches!(v, Violation::TooLong { file, lines: 601 } if file.ends_with("src/big.rs"))
        ),
        "{report:#?}"
    );
    assert!(
        report.iter().any(|r| r.contains("big.rs: 601 lines")),
        "{report:#?}"
    );

    // Take both away (and leave a file of exactly 600 lines): it passes.
    c.write("src/b/inner.rs", "use super::B;\n");
    c.remove("src/big.rs");
    c.write("src/c.rs", &lines(600));
    let (graph, found) = check_crate(&c.0, Extra::default());
    assert!(found.is_empty(), "{found:#?}\n{}", check::describe(&graph));
    assert!(graph["a"].contains_key("b") && graph["a"].contains_key("c"));
    assert!(
        graph["b"].is_empty() && graph["c"].is_empty(),
        "{}",
        check::describe(&graph)
    );
}

#[test]
fn the_checker_reports_a_ground_floor_arrow_up_and_a_tool_by_name() {
    let c = Planted::new("floor");
    c.write("src/lib.rs", "mod sql;\nmod error;\nmod store;\n");
    c.write("src/error.rs", "pub(crate) struct Error;\n");
    c.write("src/sql/mod.rs", "mod claim;\nuse crate::error::Error;\n");
    c.write(
        "src/sql/claim.rs",
        "fn f() { let _ = crate::store::Store::new(); }\n",
    );
    c.write("src/store.rs", "use crate::sql;\n");
    c.write(
        "Cargo.toml",
        "[package]\nname = \"x\"\n\n[dependencies]\nclap = \"4\"\nserde.workspace = true\n\n\
         [dev-dependencies]\ntracing-subscriber = \"0.3\"\n",
    );
    let extra = Extra {
        ground_floor: &["sql", "error"],
        no_tools: TOOLS,
    };
    let (_, found) = check_crate(&c.0, extra);
    let report: Vec<String> = found.iter().map(|v| v.to_string()).collect();
    assert!(
        report
            .iter()
            .any(|r| r.contains("cycle between top-level modules sql, store")),
        "{report:#?}"
    );
    assert!(
        report
            .iter()
            .any(|r| r.contains("ground-floor module sql uses store")),
        "{report:#?}"
    );
    assert!(
        report
            .iter()
            .any(|r| r.contains("depends on the tool clap")),
        "{report:#?}"
    );
    assert_eq!(found.len(), 3, "{report:#?}");

    c.write("src/sql/claim.rs", "fn f() {}\n");
    c.write(
        "Cargo.toml",
        "[package]\nname = \"x\"\n\n[dev-dependencies]\nclap = \"4\"\n",
    );
    let (_, found) = check_crate(&c.0, extra);
    assert!(found.is_empty(), "{found:#?}");
}

/// The paths of `text`, resolved from module `here`, as `a::b` strings.
fn resolved(text: &str, here: &[&str]) -> Vec<String> {
    let tokens = scan::strip_cfg_test(&scan::tokens(text));
    scan::references(&tokens)
        .into_iter()
        .filter_map(|r| {
            let mut at: Vec<String> = here.iter().map(|s| (*s).to_owned()).collect();
            at.extend(r.inline_mods);
            scan::resolve(&r.path, &at).map(|p| p.join("::"))
        })
        .collect()
}

#[test]
fn paths_are_read_from_use_trees_and_code_but_not_comments_literals_or_tests() {
    let text = r####"
        use crate::{a::{self, x as y}, b::*};
        use super::{c, super::d};
        /* crate::no /* nested crate::no */ */
        const S: &str = r#"crate::no " still"#;
        const T: &[u8] = b"crate::no";
        const Q: char = '{';
        fn f<'a>(x: &'a str) -> impl Fn() + 'a {
            let _ = $crate::e::f::<u8>();
            let _ = '"'; let _ = crate::g;
            move || self::h::i()
        }
        #[cfg(test)]
        fn t() { crate::no(); }
        #[cfg(test)]
        use crate::no;
        mod inline { use super::j; }
        pub(super) fn k() {}
    "####;
    assert_eq!(
        resolved(text, &["top", "file"]),
        [
            "a",
            "a::x",
            "b",
            "top::c",
            "d",
            "e::f",
            "g",
            "top::file::h::i",
            "top::file::j"
        ],
    );
    assert!(resolved("#![cfg(test)]\nuse crate::a;\n", &["top"]).is_empty());
    assert!(check::is_test_file(Path::new("sql/tests.rs")));
    assert!(check::is_test_file(Path::new("store/options_tests.rs")));
    assert!(check::is_test_file(Path::new("a/tests/b.rs")));
    assert!(!check::is_test_file(Path::new("tests_helper.rs")));
}

#[test]
fn a_super_path_to_a_sibling_named_like_a_top_level_module_is_reported() {
    let c = Planted::new("shadow");
    c.write("src/lib.rs", "mod cluster;\nmod sql;\n");
    c.write("src/cluster.rs", "pub(crate) fn now() {}\n");
    c.write("src/sql/mod.rs", "mod claim;\nmod cluster;\n");
    c.write("src/sql/cluster.rs", "pub(crate) fn now() {}\n");
    c.write(
        "src/sql/claim.rs",
        "use super::cluster::now;\nfn f() { now(); }\n",
    );
    let (_, found) = check_crate(&c.0, Extra::default());
    let report: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(report.len(), 1, "{report:#?}");
    assert!(
        report[0].contains("claim.rs:1: super::cluster names a sibling"),
        "{report:#?}"
    );

    c.write(
        "src/sql/claim.rs",
        "use crate::sql::cluster::now;\nfn f() { now(); }\n",
    );
    let (_, found) = check_crate(&c.0, Extra::default());
    assert!(found.is_empty(), "{found:#?}");
}
