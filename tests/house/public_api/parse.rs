//! A crate read with syn as a tree of modules: every module that is not test
//! code (private ones too, since `pub use` re-exports out of them and an
//! `impl` may sit anywhere), with its items, `use`s and impls, and name
//! resolution over them. It reads text, not the compiler's view: items that a
//! macro generates are not seen.

use std::fs;
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, Item, ItemImpl, Meta, UseTree, Visibility};

use super::render::tokens;

/// A crate's modules; the root (`src/lib.rs`) is module 0.
pub(crate) struct Crate {
    pub(crate) modules: Vec<Module>,
}

pub(crate) struct Module {
    pub(crate) parent: Option<usize>,
    /// The `cfg`s of this module and of the modules around it.
    pub(crate) cfgs: Vec<String>,
    pub(crate) items: Vec<Named>,
    pub(crate) uses: Vec<Use>,
    pub(crate) impls: Vec<ItemImpl>,
}

/// An item with a name: a module or a syn item.
pub(crate) struct Named {
    pub(crate) name: String,
    pub(crate) public: bool,
    pub(crate) hidden: bool,
    pub(crate) cfgs: Vec<String>,
    pub(crate) def: Def,
}

pub(crate) enum Def {
    Module(usize),
    Item(Box<Item>),
}

/// One name a `use` binds (a use tree is flattened into these).
pub(crate) struct Use {
    pub(crate) public: bool,
    pub(crate) hidden: bool,
    pub(crate) cfgs: Vec<String>,
    pub(crate) path: Vec<String>,
    /// The name bound; `None` for a glob.
    pub(crate) name: Option<String>,
}

/// What a path names: an item (module, index in its `items`), a module, or
/// something outside the crate, as the path written to it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Target {
    Item(usize, usize),
    Module(usize),
    External(String),
}

/// `pub use m::*` inside `m`'s own globs stops here.
const DEPTH: usize = 16;

/// The `use`s being resolved, as (module, index): one that names itself
/// (`use pooler::pooler;` beside `mod pooler;`) or a glob cycle
/// (`use super::*`) is not followed twice.
type Stack = Vec<(usize, usize)>;

impl Crate {
    pub(crate) fn load(lib: &Path) -> Self {
        let mut krate = Self {
            modules: Vec::new(),
        };
        let file = parse(lib);
        let dir = lib.parent().expect("src/").to_path_buf();
        krate.add_module(None, Vec::new(), file.items, &dir, Some(&dir));
        krate
    }

    /// Adds a module whose child files live in `dir`; `file_dir` is the
    /// folder of its file when its items are a file's (`#[path]` is
    /// relative to that), `None` inside an inline module.
    fn add_module(
        &mut self,
        parent: Option<usize>,
        cfgs: Vec<String>,
        items: Vec<Item>,
        dir: &Path,
        file_dir: Option<&Path>,
    ) -> usize {
        let id = self.modules.len();
        self.modules.push(Module {
            parent,
            cfgs: cfgs.clone(),
            items: Vec::new(),
            uses: Vec::new(),
            impls: Vec::new(),
        });
        for item in items {
            let attrs = attrs_of(&item);
            if is_test(attrs) {
                continue;
            }
            let own = cfgs_of(attrs);
            let hidden = is_hidden(attrs);
            match item {
                Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut inner = cfgs.clone();
                    inner.extend(own.iter().cloned());
                    let child = match m.content {
                        Some((_, items)) => {
                            self.add_module(Some(id), inner, items, &dir.join(&name), None)
                        }
                        None => {
                            let at = path_attr(&m.attrs);
                            let file = match &at {
                                Some(p) => file_dir.unwrap_or(dir).join(p),
                                None => module_file(dir, &name),
                            };
                            let parsed = parse(&file);
                            if is_test(&parsed.attrs) {
                                continue;
                            }
                            let here = file.parent().expect("a folder").to_path_buf();
                            // A `mod.rs` (or a `#[path]` file) keeps its
                            // children beside it; `a.rs` keeps them in `a/`.
                            let children = if at.is_some() || file.ends_with("mod.rs") {
                                here.clone()
                            } else {
                                here.join(&name)
                            };
                            self.add_module(Some(id), inner, parsed.items, &children, Some(&here))
                        }
                    };
                    self.modules[id].items.push(Named {
                        name,
                        public: is_pub(&m.vis),
                        hidden,
                        cfgs: own,
                        def: Def::Module(child),
                    });
                }
                Item::Use(u) => {
                    let mut flat = Vec::new();
                    let mut prefix = Vec::new();
                    if u.leading_colon.is_some() {
                        prefix.push("::".to_owned());
                    }
                    flatten(&u.tree, &mut prefix, &mut flat);
                    for (path, name) in flat {
                        self.modules[id].uses.push(Use {
                            public: is_pub(&u.vis),
                            hidden,
                            cfgs: own.clone(),
                            path,
                            name,
                        });
                    }
                }
                Item::Impl(i) => self.modules[id].impls.push(i),
                other => {
                    if let Some((name, public)) = name_of(&other) {
                        // `#[macro_export]` puts a macro at the crate root.
                        let at = if matches!(other, Item::Macro(_)) {
                            0
                        } else {
                            id
                        };
                        self.modules[at].items.push(Named {
                            name,
                            public,
                            hidden,
                            cfgs: own,
                            def: Def::Item(Box::new(other)),
                        });
                    }
                }
            }
        }
        id
    }

    pub(crate) fn item(&self, module: usize, index: usize) -> &Named {
        &self.modules[module].items[index]
    }

    /// The declaration of module `m` in its parent.
    pub(crate) fn module_decl(&self, m: usize) -> Option<&Named> {
        let parent = self.modules[m].parent?;
        self.modules[parent]
            .items
            .iter()
            .find(|n| matches!(n.def, Def::Module(c) if c == m))
    }

    /// Whether `t` may be re-exported: declared `pub` and not `#[doc(hidden)]`.
    pub(crate) fn is_public(&self, t: &Target) -> bool {
        let named = match t {
            Target::Item(m, i) => Some(self.item(*m, *i)),
            Target::Module(m) => self.module_decl(*m),
            Target::External(_) => return true,
        };
        named.is_some_and(|n| n.public && !n.hidden)
    }

    /// What `path` names when written in module `from`.
    pub(crate) fn resolve(&self, from: usize, path: &[String]) -> Vec<Target> {
        self.resolve_at(from, path, &mut Vec::new())
    }

    fn resolve_at(&self, from: usize, path: &[String], stack: &mut Stack) -> Vec<Target> {
        let Some((first, rest)) = path.split_first() else {
            return Vec::new();
        };
        let mut found = match first.as_str() {
            "::" => return vec![Target::External(rest.join("::"))],
            "crate" => vec![Target::Module(0)],
            "self" | "super" => self.step(Target::Module(from), first, stack),
            name => {
                let here = self.lookup_at(from, name, stack);
                // Not in scope: an extern crate (or std) then.
                if here.is_empty() {
                    vec![Target::External(name.to_owned())]
                } else {
                    here
                }
            }
        };
        for seg in rest {
            found = found
                .into_iter()
                .flat_map(|t| self.step(t, seg, stack))
                .collect();
            found.sort();
            found.dedup();
        }
        found
    }

    fn step(&self, t: Target, seg: &str, stack: &mut Stack) -> Vec<Target> {
        match t {
            Target::Module(m) => match seg {
                "self" => vec![Target::Module(m)],
                "super" => self.modules[m]
                    .parent
                    .map(Target::Module)
                    .into_iter()
                    .collect(),
                _ => self.lookup_at(m, seg, stack),
            },
            Target::External(p) => vec![Target::External(format!("{p}::{seg}"))],
            // An enum's variant or an associated item: listed with its owner.
            Target::Item(..) => Vec::new(),
        }
    }

    /// What `name` means in module `m`, in every namespace: its items and
    /// imports, else what its globs bring.
    pub(crate) fn lookup(&self, m: usize, name: &str) -> Vec<Target> {
        self.lookup_at(m, name, &mut Vec::new())
    }

    fn lookup_at(&self, m: usize, name: &str, stack: &mut Stack) -> Vec<Target> {
        let module = &self.modules[m];
        let mut found: Vec<Target> = module
            .items
            .iter()
            .enumerate()
            .filter(|(_, n)| n.name == name)
            .map(|(i, n)| match n.def {
                Def::Module(c) => Target::Module(c),
                Def::Item(_) => Target::Item(m, i),
            })
            .collect();
        for glob in [false, true] {
            // A glob brings a name only when nothing else binds it.
            if glob && !found.is_empty() {
                break;
            }
            for (i, u) in module.uses.iter().enumerate() {
                let wanted = if glob {
                    u.name.is_none()
                } else {
                    u.name.as_deref() == Some(name)
                };
                if !wanted || stack.contains(&(m, i)) {
                    continue;
                }
                stack.push((m, i));
                for t in self.resolve_at(m, &u.path, stack) {
                    match t {
                        Target::Module(g) if glob => found.extend(self.lookup_at(g, name, stack)),
                        _ if glob => {}
                        t => found.push(t),
                    }
                }
                stack.pop();
            }
        }
        found.sort();
        found.dedup();
        found
    }

    /// The names module `m` makes public (for a `pub use m::*`).
    pub(crate) fn public_names(&self, m: usize, depth: usize) -> Vec<String> {
        let module = &self.modules[m];
        let mut names: Vec<String> = module
            .items
            .iter()
            .filter(|n| n.public && !n.hidden)
            .map(|n| n.name.clone())
            .collect();
        for u in module.uses.iter().filter(|u| u.public && !u.hidden) {
            match &u.name {
                Some(n) => names.push(n.clone()),
                None if depth < DEPTH => {
                    for t in self.resolve(m, &u.path) {
                        if let Target::Module(g) = t {
                            names.extend(self.public_names(g, depth + 1));
                        }
                    }
                }
                None => {}
            }
        }
        names.sort();
        names.dedup();
        names
    }
}

fn parse(file: &Path) -> syn::File {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {}: {e}", file.display()))
}

/// `dir/name.rs` or `dir/name/mod.rs`.
fn module_file(dir: &Path, name: &str) -> PathBuf {
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// Each name a use tree binds, as (path, name); a glob has no name.
fn flatten(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |prefix: &[String], ident: String| {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident);
        }
        path
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let path = with(prefix, n.ident.to_string());
            let name = path.last().cloned();
            out.push((path, name));
        }
        UseTree::Rename(r) => {
            out.push((
                with(prefix, r.ident.to_string()),
                Some(r.rename.to_string()),
            ));
        }
        UseTree::Glob(_) => out.push((prefix.clone(), None)),
        UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
    }
}

fn name_of(item: &Item) -> Option<(String, bool)> {
    let (ident, vis) = match item {
        Item::Const(i) => (&i.ident, &i.vis),
        Item::Enum(i) => (&i.ident, &i.vis),
        Item::Fn(i) => (&i.sig.ident, &i.vis),
        Item::Static(i) => (&i.ident, &i.vis),
        Item::Struct(i) => (&i.ident, &i.vis),
        Item::Trait(i) => (&i.ident, &i.vis),
        Item::TraitAlias(i) => (&i.ident, &i.vis),
        Item::Type(i) => (&i.ident, &i.vis),
        Item::Union(i) => (&i.ident, &i.vis),
        Item::Macro(i) if has(&i.attrs, "macro_export") => {
            return i.ident.as_ref().map(|id| (id.to_string(), true));
        }
        _ => return None,
    };
    Some((ident.to_string(), is_pub(vis)))
}

fn attrs_of(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Only plain `pub` is public API; `pub(crate)` and the like are not.
pub(crate) fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

/// The tokens inside `#[name(...)]`, if `attr` is that.
fn list_of(attr: &Attribute, name: &str) -> Option<String> {
    match &attr.meta {
        Meta::List(l) if l.path.is_ident(name) => Some(tokens(&l.tokens)),
        _ => None,
    }
}

/// `#[cfg(test)]` or `#[cfg(doctest)]`: not part of the library.
pub(crate) fn is_test(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| matches!(list_of(a, "cfg").as_deref(), Some("test" | "doctest")))
}

/// The conditions of the `#[cfg(...)]`s (features, mostly).
pub(crate) fn cfgs_of(attrs: &[Attribute]) -> Vec<String> {
    attrs.iter().filter_map(|a| list_of(a, "cfg")).collect()
}

pub(crate) fn is_hidden(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| list_of(a, "doc").is_some_and(|d| d.split(',').any(|w| w.trim() == "hidden")))
}

pub(crate) fn has(attrs: &[Attribute], name: &str) -> bool {
    attrs.iter().any(|a| a.path().is_ident(name))
}

fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The traits of `#[derive(...)]`, by their last segment.
pub(crate) fn derives(attrs: &[Attribute]) -> Vec<String> {
    let mut out = Vec::new();
    for a in attrs.iter().filter(|a| a.path().is_ident("derive")) {
        let paths = a
            .parse_args_with(Punctuated::<syn::Path, syn::Token![,]>::parse_terminated)
            .expect("a derive list");
        out.extend(
            paths
                .iter()
                .filter_map(|p| p.segments.last())
                .map(|s| s.ident.to_string()),
        );
    }
    out
}
