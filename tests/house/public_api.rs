//! **The public API is on record.** Each library's public API (`workerutil`,
//! `dbworker`, `dbworker-testkit`), read from its sources with syn, is kept
//! in `<crate>/public-api.txt`, one sorted line per item: so a change to
//! what users can name shows in review as a diff, and an accidental one fails
//! `cargo test`.
//!
//! From `src/lib.rs` the reader follows `pub mod` (files, inline modules,
//! `#[path]`) and `pub use` (`crate::`, `self::`, `super::` and globs, into
//! private modules too). `#[cfg(test)]` and `#[doc(hidden)]` are left out;
//! anything under another `#[cfg(...)]` (a feature) is kept and carries it.
//! An item is listed once, at its canonical path: the shortest, a prelude's
//! last; every other path to it is a `reexport` line, as is each re-export
//! of another crate's item. Members follow their item: pub fields, variants,
//! trait items, the pub fns of inherent impls (wherever the impl is), and
//! `impl Trait for X` for trait impls and derives; `#[non_exhaustive]` shows.
//!
//! **One public path per item.** An item reachable at two public paths
//! (`dbworker::RetryPolicy` and `dbworker::RetryPolicy`) makes users
//! and docs disagree on its name; the ones there are, are listed in
//! `tests/house/public_api_aliases.txt`, which is to shrink, never grow. A
//! `prelude` module exists to re-export, so its paths do not count.
//!
//! `UPDATE_SNAPSHOTS=1` rewrites the three snapshots and the list.

mod parse;
mod render;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use parse::{Crate, Def, Target, cfgs_of, is_hidden, is_test};

/// The crates on record: (folder, name in paths).
const CRATES: [(&str, &str); 3] = [
    ("workerutil", "workerutil"),
    ("dbworker", "dbworker"),
    ("testkit", "dbworker_testkit"),
];

const ALIASES: &str = "tests/house/public_api_aliases.txt";

const UPDATE: &str = "UPDATE_SNAPSHOTS=1 cargo test -p dbworker-suite --test house public_api";

/// Each thing's public paths, with the `cfg`s met on the way to each.
type Paths = BTreeMap<Target, Vec<(String, Vec<String>)>>;

/// A crate's public API as snapshot lines, and its items at two paths.
pub(crate) struct Api {
    pub(crate) lines: Vec<String>,
    pub(crate) aliases: Vec<String>,
}

/// The public API of the crate whose root is `lib`, with paths from `name`.
pub(crate) fn api(lib: &Path, name: &str) -> Api {
    let k = Crate::load(lib);
    let mut paths = Paths::new();
    walk(&k, 0, name, &[], 0, &mut paths);
    for found in paths.values_mut() {
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
    }
    let canon: BTreeMap<&Target, &(String, Vec<String>)> = paths
        .iter()
        .map(|(t, found)| {
            (
                t,
                found.iter().min_by_key(|(p, _)| rank(p)).expect("a path"),
            )
        })
        .collect();

    let mut lines = Vec::new();
    for (t, found) in &paths {
        let (at, cfgs) = canon[t];
        match t {
            Target::Item(m, i) => {
                if let Def::Item(item) = &k.item(*m, *i).def {
                    lines.extend(render::item_lines(item, at, cfgs));
                }
            }
            Target::Module(_) => {
                let last = at.rsplit("::").next().expect("a name");
                lines.push(format!("{at}: {}pub mod {last}", cfg_prefix(cfgs)));
            }
            Target::External(_) => {}
        }
        for (p, cfgs) in found {
            let to = match t {
                Target::External(e) => e,
                _ if p == at => continue,
                _ => at,
            };
            lines.push(format!("{p}: {}reexport {p} = {to}", cfg_prefix(cfgs)));
        }
    }

    // Impls sit anywhere; each goes to its type, else to its trait.
    for (m, module) in k.modules.iter().enumerate() {
        for imp in &module.impls {
            if is_test(&imp.attrs) || is_hidden(&imp.attrs) {
                continue;
            }
            let owner = owner(&k, m, &imp.self_ty, false)
                .and_then(|t| canon.get(&t))
                .or_else(|| {
                    let (_, tr, _) = imp.trait_.as_ref()?;
                    let ty = syn::Type::Path(syn::TypePath {
                        qself: None,
                        path: tr.clone(),
                    });
                    owner(&k, m, &ty, true).and_then(|t| canon.get(&t))
                });
            if let Some((at, own)) = owner {
                let mut cfgs = module.cfgs.clone();
                cfgs.extend(cfgs_of(&imp.attrs));
                cfgs.extend(own.iter().cloned());
                lines.extend(render::impl_lines(imp, at, &cfgs));
            }
        }
    }
    lines.sort();

    let mut aliases = Vec::new();
    for (t, found) in &paths {
        let outside: Vec<&str> = found
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| !in_prelude(p))
            .collect();
        if outside.len() > 1 {
            let origin = match t {
                Target::External(e) => format!(" (reexports {e})"),
                _ => String::new(),
            };
            aliases.push(format!("{}{origin}", outside.join(" = ")));
        }
    }
    aliases.sort();
    Api { lines, aliases }
}

fn in_prelude(path: &str) -> bool {
    path.split("::").any(|s| s == "prelude")
}

/// The canonical path sorts first: out of a prelude, shortest, then by name.
fn rank(path: &str) -> (bool, usize, &str) {
    (in_prelude(path), path.split("::").count(), path)
}

fn cfg_prefix(cfgs: &[String]) -> String {
    cfgs.iter().map(|c| format!("#[cfg({c})] ")).collect()
}

/// Records what module `m` makes public under `prefix`, and goes into the
/// modules it makes public.
fn walk(k: &Crate, m: usize, prefix: &str, cfgs: &[String], depth: usize, out: &mut Paths) {
    // A module re-exported inside itself would loop.
    if depth > 8 {
        return;
    }
    let module = &k.modules[m];
    let with = |more: &[String]| -> Vec<String> {
        let mut all = cfgs.to_vec();
        all.extend(more.iter().cloned());
        all.sort();
        all.dedup();
        all
    };
    for (i, n) in module.items.iter().enumerate() {
        let t = match n.def {
            Def::Module(c) => Target::Module(c),
            Def::Item(_) => Target::Item(m, i),
        };
        if k.is_public(&t) {
            reach(
                k,
                t,
                format!("{prefix}::{}", n.name),
                with(&n.cfgs),
                depth,
                out,
            );
        }
    }
    for u in module.uses.iter().filter(|u| u.public && !u.hidden) {
        let cfgs = with(&u.cfgs);
        match &u.name {
            Some(name) if name != "_" => {
                for t in k.resolve(m, &u.path) {
                    if k.is_public(&t) {
                        reach(k, t, format!("{prefix}::{name}"), cfgs.clone(), depth, out);
                    }
                }
            }
            Some(_) => {}
            None => {
                for g in k.resolve(m, &u.path) {
                    match g {
                        Target::Module(g) => {
                            for name in k.public_names(g, 0) {
                                // A name the module binds itself shadows the glob's.
                                if module.items.iter().any(|n| n.name == name)
                                    || module.uses.iter().any(|u| u.name.as_ref() == Some(&name))
                                {
                                    continue;
                                }
                                for t in k.lookup(g, &name).into_iter().filter(|t| k.is_public(t)) {
                                    let p = format!("{prefix}::{name}");
                                    reach(k, t, p, cfgs.clone(), depth, out);
                                }
                            }
                        }
                        Target::External(e) => {
                            let t = Target::External(format!("{e}::*"));
                            reach(k, t, format!("{prefix}::*"), cfgs.clone(), depth, out);
                        }
                        // `pub use Enum::*`: the variants are listed with the enum.
                        Target::Item(..) => {}
                    }
                }
            }
        }
    }
}

fn reach(k: &Crate, t: Target, path: String, cfgs: Vec<String>, depth: usize, out: &mut Paths) {
    if let Target::Module(c) = t {
        walk(k, c, &path, &cfgs, depth + 1, out);
    }
    out.entry(t).or_default().push((path, cfgs));
}

/// The crate item a type (or, with `want_trait`, a trait) path in module `m`
/// names, if any.
fn owner(k: &Crate, m: usize, ty: &syn::Type, want_trait: bool) -> Option<Target> {
    let syn::Type::Path(p) = ty else { return None };
    if p.qself.is_some() {
        return None;
    }
    let mut segs: Vec<String> = p
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if p.path.leading_colon.is_some() {
        segs.insert(0, "::".to_owned());
    }
    k.resolve(m, &segs).into_iter().find(|t| match t {
        Target::Item(m, i) => match &k.item(*m, *i).def {
            Def::Item(item) => match **item {
                syn::Item::Trait(_) => want_trait,
                syn::Item::Struct(_)
                | syn::Item::Enum(_)
                | syn::Item::Union(_)
                | syn::Item::Type(_) => !want_trait,
                _ => false,
            },
            Def::Module(_) => false,
        },
        _ => false,
    })
}

/// Compares the lines of `file` (but its `#` comments) with `lines`, or
/// rewrites it under `UPDATE_SNAPSHOTS`; a difference reads as a diff.
fn compare(file: &Path, header: &str, lines: &[String]) -> Option<String> {
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
        fs::write(file, format!("{header}{body}"))
            .unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        return None;
    }
    let text = fs::read_to_string(file).unwrap_or_default();
    let mut want: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    want.sort_unstable();
    let diff = diff(&want, lines);
    if diff.is_empty() {
        return None;
    }
    let more = diff.len().saturating_sub(40);
    let more = if more > 0 {
        format!("\n… and {more} more")
    } else {
        String::new()
    };
    Some(format!(
        "{} differs from the code (`-` on record, `+` now):\n{}{more}\n\
         If the change is meant, run `{UPDATE}` and commit the file.",
        file.display(),
        diff[..diff.len().min(40)].join("\n"),
    ))
}

/// The lines only in `want` (`- `) or only in `got` (`+ `), both sorted.
fn diff(want: &[&str], got: &[String]) -> Vec<String> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < want.len() || j < got.len() {
        match (want.get(i), got.get(j)) {
            (Some(w), Some(g)) if *w == g.as_str() => (i, j) = (i + 1, j + 1),
            (Some(w), Some(g)) if *w < g.as_str() => {
                out.push(format!("- {w}"));
                i += 1;
            }
            (Some(w), None) => {
                out.push(format!("- {w}"));
                i += 1;
            }
            (_, Some(g)) => {
                out.push(format!("+ {g}"));
                j += 1;
            }
            (None, None) => unreachable!("the loop's condition"),
        }
    }
    out
}

#[test]
fn each_library_s_public_api_matches_its_snapshot() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for (dir, name) in CRATES {
        let api = api(&root.join(dir).join("src/lib.rs"), name);
        let header = format!(
            "# The public API of `{name}`, one line per item at its canonical path\n\
             # (tests/house/public_api.rs). After a change: {UPDATE}\n"
        );
        failures.extend(compare(
            &root.join(dir).join("public-api.txt"),
            &header,
            &api.lines,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn each_public_item_has_one_path_but_the_listed_aliases() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut aliases = Vec::new();
    for (dir, name) in CRATES {
        aliases.extend(api(&root.join(dir).join("src/lib.rs"), name).aliases);
    }
    aliases.sort();
    let header = "# Public items reachable at more than one public path (a prelude's\n\
                  # paths aside), from tests/house/public_api.rs. Shrink it: give each\n\
                  # item one path, then run UPDATE_SNAPSHOTS=1; never grow it.\n";
    let failure = compare(&root.join(ALIASES), header, &aliases);
    assert!(
        failure.is_none(),
        "an item's public paths changed: {}",
        failure.unwrap_or_default()
    );
}

#[test]
fn the_reader_follows_modules_reexports_and_impls_and_leaves_out_tests() {
    let c = crate::Planted::new("public-api");
    c.write(
        "src/lib.rs",
        "mod inner;\nmod sql;\npub mod prelude { pub use crate::Thing; }\n\
         #[cfg(feature = \"extra\")]\npub mod extra { pub fn more() {} }\n\
         #[path = \"elsewhere.rs\"]\npub mod moved;\npub mod only_tests;\n\
         pub use inner::{Thing, helper as renamed};\npub use inner::deep::*;\n\
         pub use sql::{pooler, Pooler};\npub use serde;\n\
         pub mod outer { pub use super::inner::Thing; }\n\
         #[cfg(test)]\npub mod tests {}\n#[doc(hidden)]\npub fn hidden() {}\n",
    );
    c.write(
        "src/inner/mod.rs",
        "pub mod deep;\n/// Docs are not API.\n#[non_exhaustive]\n#[derive(Debug, Clone)]\n\
         pub struct Thing<T: Send> { pub a: u8, b: T }\n\
         pub fn helper(mut x: &'static str,\n    y: Vec<Vec<u8>>,\n) -> Option<(u8,)> { None }\n",
    );
    c.write(
        "src/inner/deep.rs",
        "use super::Thing;\nimpl<T: Send> Thing<T> {\n    pub fn get(mut self) -> T { self.b }\n    \
         fn private(&self) {}\n    #[doc(hidden)]\n    pub fn secret(&self) {}\n}\n\
         impl<T: Send> std::fmt::Display for Thing<T> {\n    \
         fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { Ok(()) }\n}\n\
         pub enum Kind { A, B(u8), #[non_exhaustive] C { x: i32 } }\n\
         pub trait Tr: Send { type Out: Clone; fn f(&self) -> Self::Out; fn g(&self) {} }\n\
         impl Tr for u8 { type Out = u8; fn f(&self) -> u8 { 1 } }\n",
    );
    c.write(
        "src/sql/mod.rs",
        "mod pooler;\npub use pooler::{pooler, Pooler};\n",
    );
    c.write(
        "src/sql/pooler.rs",
        "pub struct Pooler;\npub fn pooler() -> Pooler { Pooler }\n",
    );
    c.write("src/only_tests.rs", "#![cfg(test)]\npub fn t() {}\n");
    c.write("src/elsewhere.rs", "pub const N: usize = 1;\n");
    let api = api(&c.0.join("src/lib.rs"), "k");
    let want = [
        "k::Kind: pub enum Kind",
        "k::Kind::A: A",
        "k::Kind::B: B(u8)",
        "k::Kind::C: #[non_exhaustive] C { x: i32 }",
        "k::Pooler: pub struct Pooler;",
        "k::Thing: #[non_exhaustive] pub struct Thing<T: Send> { /* private fields */ }",
        "k::Thing: impl Clone for Thing<T>",
        "k::Thing: impl Debug for Thing<T>",
        "k::Thing: impl<T: Send> Display for Thing<T>",
        "k::Thing::a: pub a: u8",
        "k::Thing::get: pub fn get(self) -> T (in impl<T: Send> Thing<T>)",
        "k::Tr: impl Tr for u8 { type Out = u8; }",
        "k::Tr: pub trait Tr: Send",
        "k::Tr::Out: type Out: Clone;",
        "k::Tr::f: fn f(&self) -> Self::Out;",
        "k::Tr::g: fn g(&self) { .. }",
        "k::extra: #[cfg(feature = \"extra\")] pub mod extra",
        "k::extra::more: #[cfg(feature = \"extra\")] pub fn more()",
        "k::moved: pub mod moved",
        "k::moved::N: pub const N: usize",
        "k::outer: pub mod outer",
        "k::outer::Thing: reexport k::outer::Thing = k::Thing",
        "k::pooler: pub fn pooler() -> Pooler",
        "k::prelude: pub mod prelude",
        "k::prelude::Thing: reexport k::prelude::Thing = k::Thing",
        "k::renamed: pub fn helper(x: &'static str, y: Vec<Vec<u8>>) -> Option<(u8,)>",
        "k::serde: reexport k::serde = serde",
    ];
    assert_eq!(api.lines, want, "{:#?}", api.lines);
    assert_eq!(api.aliases, ["k::Thing = k::outer::Thing"]);
    let recorded: Vec<&str> = want[..3].to_vec();
    let got: Vec<String> = ["k::Kind: pub enum Kind", "k::Kind::A: A", "k::New: x"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        diff(&recorded, &got),
        ["- k::Kind::B: B(u8)", "+ k::New: x"]
    );
}
