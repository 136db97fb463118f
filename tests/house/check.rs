//! The checks on one crate: the graph of its top-level modules and its cycles,
//! the ground floor, the length of its files, and the tools it must not pull in.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use crate::scan;

/// The most lines a non-test source file may have.
pub(crate) const MAX_LINES: usize = 600;

/// What a crate is held to beyond the rules every crate keeps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extra<'a> {
    /// Top-level modules that may use only one another.
    pub(crate) ground_floor: &'a [&'a str],
    /// Packages its `[dependencies]` must not name.
    pub(crate) no_tools: &'a [&'a str],
}

/// Where one module uses another: the file, its line, and the name used after
/// the module (`*` for the module itself).
#[derive(Debug, Clone)]
pub(crate) struct Use {
    pub(crate) file: PathBuf,
    pub(crate) line: usize,
    pub(crate) name: String,
}

/// `graph[a][b]`: every place where top-level module `a` uses `b`.
pub(crate) type Graph = BTreeMap<String, BTreeMap<String, Vec<Use>>>;

/// A broken rule, by name.
#[derive(Debug)]
pub(crate) enum Violation {
    /// Top-level modules that use one another, directly or through others.
    Cycle {
        crate_dir: PathBuf,
        /// Every module of the strongly connected component, sorted.
        modules: Vec<String>,
        /// One cycle through them: `a -> b -> … -> a`, with where each arrow is.
        cycle: Vec<(String, String, Use)>,
    },
    /// A non-test source file over `MAX_LINES` lines.
    TooLong { file: PathBuf, lines: usize },
    /// A ground-floor module that uses a module above it.
    GroundFloor {
        crate_dir: PathBuf,
        from: String,
        to: String,
        at: Use,
    },
    /// A tool in a library's `[dependencies]`.
    Tool { manifest: PathBuf, package: String },
    /// `super::x::…` in a folder's file, where `x` is a sibling that shares
    /// its name with a top-level module: write `crate::<folder>::x`, so no
    /// reader (nor a tool that reads paths as text) takes it for the other.
    Shadowed { at: Use, sibling: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cycle {
                crate_dir,
                modules,
                cycle,
            } => {
                write!(
                    f,
                    "{}: cycle between top-level modules {}:",
                    crate_dir.display(),
                    modules.join(", ")
                )?;
                for (a, b, at) in cycle {
                    write!(
                        f,
                        "\n    {a} -> {b} ({}:{}: {b}::{})",
                        at.file.display(),
                        at.line,
                        at.name
                    )?;
                }
                Ok(())
            }
            Self::TooLong { file, lines } => {
                write!(f, "{}: {lines} lines, over {MAX_LINES}", file.display())
            }
            Self::GroundFloor {
                crate_dir,
                from,
                to,
                at,
            } => write!(
                f,
                "{}: ground-floor module {from} uses {to}, a module above it ({}:{}: {to}::{})",
                crate_dir.display(),
                at.file.display(),
                at.line,
                at.name
            ),
            Self::Tool { manifest, package } => write!(
                f,
                "{}: the library depends on the tool {package}",
                manifest.display()
            ),
            Self::Shadowed { at, sibling } => write!(
                f,
                "{}:{}: super::{sibling} names a sibling that shares its name with the top-level module {sibling}; write it from crate::",
                at.file.display(),
                at.line
            ),
        }
    }
}

/// Whether `rel` (a path under `src/`) is test code: a file named `tests.rs` or
/// `*_tests.rs`, or any file under a `tests/` folder.
pub(crate) fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

/// Every `.rs` file under `dir`, as paths relative to `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let entries = fs::read_dir(dir.join(&rel))
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.join(&rel).display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let path = rel.join(entry.file_name());
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file under `src/`: `a/b.rs` is `a::b`, `a/mod.rs` and
/// `a.rs` are `a`, `lib.rs` and `main.rs` are the root (empty).
fn module_path(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let roof = segs.len() == 1 && matches!(segs[0].as_str(), "lib" | "main");
    if roof || segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    segs
}

/// The graph of the crate's top-level modules, read from the non-test code of
/// every file under `src/` but `src/bin/` and the roof (`lib.rs`, `main.rs`),
/// with the `super::` paths that name a sibling by a top-level module's name.
pub(crate) fn module_graph(crate_dir: &Path) -> (Graph, Vec<Violation>) {
    let src = crate_dir.join("src");
    let files: Vec<PathBuf> = rust_files(&src)
        .into_iter()
        .filter(|rel| !rel.starts_with("bin"))
        .collect();
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|rel| module_path(rel).into_iter().next())
        .collect();
    let mut graph: Graph = tops.iter().map(|t| (t.clone(), BTreeMap::new())).collect();
    let mut shadowed = Vec::new();
    for rel in files.iter().filter(|rel| !is_test_file(rel)) {
        let here = module_path(rel);
        let Some(top) = here.first() else { continue }; // the roof
        let text = fs::read_to_string(src.join(rel))
            .unwrap_or_else(|e| panic!("reading {}: {e}", src.join(rel).display()));
        let tokens = scan::strip_cfg_test(&scan::tokens(&text));
        for r in scan::references(&tokens) {
            let mut at = here.clone();
            at.extend(r.inline_mods.iter().cloned());
            let Some(target) = scan::resolve(&r.path, &at) else {
                continue;
            };
            let Some(to) = target.first() else { continue };
            let after_supers = r.path.iter().find(|s| *s != "super");
            if r.path.first().is_some_and(|s| s == "super")
                && to == top
                && let Some(sibling) = after_supers.filter(|s| *s != top && tops.contains(*s))
            {
                shadowed.push(Violation::Shadowed {
                    at: Use {
                        file: crate_dir.join("src").join(rel),
                        line: r.line,
                        name: sibling.clone(),
                    },
                    sibling: sibling.clone(),
                });
            }
            if to == top || !tops.contains(to) {
                continue;
            }
            let name = target.get(1).cloned().unwrap_or_else(|| "*".into());
            let uses = graph
                .entry(top.clone())
                .or_default()
                .entry(to.clone())
                .or_default();
            uses.push(Use {
                file: crate_dir.join("src").join(rel),
                line: r.line,
                name,
            });
        }
    }
    (graph, shadowed)
}

/// The strongly connected components of more than one module (Tarjan).
pub(crate) fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flat_map(|m| m.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self
                    .stack
                    .iter()
                    .rposition(|&x| x == v)
                    .expect("on the stack");
                let mut comp: Vec<String> = self.stack.drain(at..).map(String::from).collect();
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// The shortest cycle from `comp[0]` back to itself inside the component.
fn one_cycle(graph: &Graph, comp: &[String]) -> Vec<(String, String, Use)> {
    let start = &comp[0];
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start.as_str()]);
    let mut last = None;
    'bfs: while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().filter(|w| comp.contains(w)) {
            if w == start {
                last = Some(v);
                break 'bfs;
            }
            if !parent.contains_key(w.as_str()) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut nodes = vec![start.as_str()];
    let mut v = last.expect("a component has a cycle through each member");
    while v != start {
        nodes.push(v);
        v = parent[v];
    }
    nodes.push(start);
    nodes.reverse(); // start, …, start
    nodes
        .windows(2)
        .map(|w| {
            (
                w[0].to_owned(),
                w[1].to_owned(),
                graph[w[0]][w[1]][0].clone(),
            )
        })
        .collect()
}

/// The non-test source files under `src/` over `MAX_LINES` lines.
pub(crate) fn long_files(crate_dir: &Path) -> Vec<Violation> {
    let src = crate_dir.join("src");
    rust_files(&src)
        .into_iter()
        .filter(|rel| !is_test_file(rel))
        .filter_map(|rel| {
            let file = src.join(rel);
            let text = fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let lines = text.lines().count();
            (lines > MAX_LINES).then_some(Violation::TooLong { file, lines })
        })
        .collect()
}

/// The packages of `tools` that `manifest` names in a `[dependencies]` table
/// (also `[target.….dependencies]`, `[build-dependencies]`, `[dependencies.x]`);
/// dev-dependencies do not ship and are not counted.
pub(crate) fn tools_in(manifest: &Path, tools: &[&str]) -> Vec<Violation> {
    let text = fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    let mut found = Vec::new();
    let mut in_deps = false;
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']').trim();
            let table = header.rsplit('.').next().unwrap_or(header);
            let is_deps = |t: &str| t.ends_with("dependencies") && !t.ends_with("dev-dependencies");
            in_deps = is_deps(table);
            // [dependencies.clap]
            if let Some((parent, name)) = header.rsplit_once('.')
                && is_deps(parent.rsplit('.').next().unwrap_or(parent))
            {
                found.push(name.trim_matches('"').to_owned());
            }
            continue;
        }
        if in_deps && let Some((key, _)) = line.split_once('=') {
            let key = key.trim().trim_matches('"');
            found.push(key.split('.').next().unwrap_or(key).to_owned());
        }
    }
    found
        .into_iter()
        .filter(|dep| tools.contains(&dep.as_str()))
        .map(|package| Violation::Tool {
            manifest: manifest.to_path_buf(),
            package,
        })
        .collect()
}

/// Every rule, on the crate at `crate_dir`; with the graph, to print.
pub(crate) fn check_crate(crate_dir: &Path, extra: Extra<'_>) -> (Graph, Vec<Violation>) {
    let (graph, shadowed) = module_graph(crate_dir);
    let mut out: Vec<Violation> = cycles(&graph)
        .into_iter()
        .map(|modules| Violation::Cycle {
            crate_dir: crate_dir.to_path_buf(),
            cycle: one_cycle(&graph, &modules),
            modules,
        })
        .collect();
    for from in extra.ground_floor {
        for (to, uses) in graph.get(*from).into_iter().flatten() {
            if !extra.ground_floor.contains(&to.as_str()) {
                out.push(Violation::GroundFloor {
                    crate_dir: crate_dir.to_path_buf(),
                    from: (*from).to_owned(),
                    to: to.clone(),
                    at: uses[0].clone(),
                });
            }
        }
    }
    out.extend(shadowed);
    out.extend(long_files(crate_dir));
    if !extra.no_tools.is_empty() {
        out.extend(tools_in(&crate_dir.join("Cargo.toml"), extra.no_tools));
    }
    (graph, out)
}

/// The graph as lines: each module and what it uses (with how many names).
pub(crate) fn describe(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(a, uses)| {
            let used: Vec<String> = uses
                .iter()
                .map(|(b, u)| {
                    format!(
                        "{b}({})",
                        u.iter().map(|u| &u.name).collect::<BTreeSet<_>>().len()
                    )
                })
                .collect();
            format!(
                "  {a:<16} uses: {}\n",
                if used.is_empty() {
                    "-".into()
                } else {
                    used.join(", ")
                }
            )
        })
        .collect()
}
