//! Items as snapshot lines: `(path, text)`, the text on one line in the
//! spacing rustfmt would give it, so the snapshot reads like the source and
//! a diff shows the changed signature.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Fields, Generics, ImplItem, Item, ItemImpl, Signature, TraitItem, Type, Variant};

use super::parse::{cfgs_of, derives, has, is_hidden, is_pub, is_test};

/// `tokens` on one line, spaced as rustfmt spaces a signature.
pub(crate) fn tokens(t: &impl ToTokens) -> String {
    let mut list = Vec::new();
    atoms(t.to_token_stream(), &mut list);
    let mut out = String::new();
    let mut prev: Option<&Atom> = None;
    for (i, a) in list.iter().enumerate() {
        // A trailing comma (rustfmt's, on a long list) is not the API.
        let closes = matches!(list.get(i + 1), None | Some(Atom::Close('}')))
            || matches!(list.get(i + 1), Some(Atom::Op(o)) if o == ">");
        if matches!(a, Atom::Op(o) if o == ",") && closes {
            continue;
        }
        if prev.is_some_and(|p| space(p, a)) {
            out.push(' ');
        }
        match a {
            Atom::Word(w) | Atom::Op(w) => out.push_str(w),
            Atom::Open(c) | Atom::Close(c) => out.push(*c),
        }
        prev = Some(a);
    }
    out
}

enum Atom {
    Word(String),
    /// Punctuation, joined (`->`, `::`).
    Op(String),
    Open(char),
    Close(char),
}

fn atoms(stream: TokenStream, out: &mut Vec<Atom>) {
    let mut pending = String::new();
    let mut iter = stream.into_iter().peekable();
    while let Some(tree) = iter.next() {
        if let TokenTree::Punct(p) = &tree {
            if p.as_char() == '\'' && p.spacing() == Spacing::Joint {
                if !pending.is_empty() {
                    out.push(Atom::Op(std::mem::take(&mut pending)));
                }
                // A lifetime: `'` then its name.
                if let Some(TokenTree::Ident(name)) = iter.next() {
                    out.push(Atom::Word(format!("'{name}")));
                }
                continue;
            }
            pending.push(p.as_char());
            if p.spacing() == Spacing::Alone {
                out.push(Atom::Op(std::mem::take(&mut pending)));
            }
            continue;
        }
        if !pending.is_empty() {
            out.push(Atom::Op(std::mem::take(&mut pending)));
        }
        match tree {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ('(', ')'),
                    Delimiter::Bracket => ('[', ']'),
                    Delimiter::Brace => ('{', '}'),
                    Delimiter::None => {
                        atoms(g.stream(), out);
                        continue;
                    }
                };
                out.push(Atom::Open(open));
                atoms(g.stream(), out);
                out.push(Atom::Close(close));
            }
            TokenTree::Ident(i) => out.push(Atom::Word(i.to_string())),
            TokenTree::Literal(l) => out.push(Atom::Word(l.to_string())),
            TokenTree::Punct(_) => unreachable!("handled above"),
        }
    }
    if !pending.is_empty() {
        out.push(Atom::Op(pending));
    }
}

/// Whether a space goes between `prev` and `next`.
fn space(prev: &Atom, next: &Atom) -> bool {
    let op = |a: &Atom, set: &[&str]| matches!(a, Atom::Op(o) if set.contains(&o.as_str()));
    // `>`, `>>`: a generic list closing.
    let closing = |a: &Atom| matches!(a, Atom::Op(o) if o.chars().all(|c| c == '>'));
    if matches!((prev, next), (Atom::Open('{'), Atom::Close('}'))) {
        return false;
    }
    if matches!(next, Atom::Close(')' | ']')) || op(next, &[",", ";", ":", "."]) || closing(next) {
        return false;
    }
    if matches!(prev, Atom::Open('(' | '['))
        || op(prev, &["&", "&&", "*", "<", "::", "#", "!", "?", ".", ".."])
    {
        return false;
    }
    match (prev, next) {
        (Atom::Word(_) | Atom::Close(_), Atom::Op(o)) if o == "::" => false,
        (Atom::Op(_), Atom::Op(o)) if o == "::" => !closing(prev),
        (Atom::Word(_), Atom::Op(o)) if o == "<" => false,
        (Atom::Op(_), Atom::Open('(')) if closing(prev) => false,
        // `fn(u8)`, `Fn(u8)`, `pub(crate)`; but `&mut (A, B)`, `dyn (A)`.
        (Atom::Word(w), Atom::Open('(')) => {
            ["mut", "dyn", "impl", "as", "where"].contains(&w.as_str())
        }
        _ => true,
    }
}

/// `#[cfg(x)] ` for each condition, before an item's text.
fn cfg_prefix(cfgs: &[String]) -> String {
    cfgs.iter().map(|c| format!("#[cfg({c})] ")).collect()
}

fn non_exhaustive(attrs: &[syn::Attribute]) -> &'static str {
    if has(attrs, "non_exhaustive") {
        "#[non_exhaustive] "
    } else {
        ""
    }
}

/// Generics and where clause without rustfmt's trailing commas.
/// `: A + B` for a trait's supertraits or an associated type's bounds;
/// nothing when there are none.
fn bound_list<P: ToTokens + Clone>(
    bounds: &syn::punctuated::Punctuated<syn::TypeParamBound, P>,
) -> String {
    let mut bounds = bounds.clone();
    bounds.pop_punct();
    if bounds.is_empty() {
        String::new()
    } else {
        format!(": {}", tokens(&bounds))
    }
}

fn generics(g: &Generics) -> (String, String) {
    let mut g = g.clone();
    g.params.pop_punct();
    let wh = g.where_clause.take().map(|mut w| {
        w.predicates.pop_punct();
        format!(" {}", tokens(&w))
    });
    (tokens(&g), wh.unwrap_or_default())
}

/// A signature without attributes on its parameters or `mut` bindings,
/// which are not API.
pub(crate) fn signature(sig: &Signature) -> String {
    let mut sig = sig.clone();
    sig.inputs.pop_punct();
    sig.generics.params.pop_punct();
    if let Some(w) = &mut sig.generics.where_clause {
        w.predicates.pop_punct();
    }
    for arg in &mut sig.inputs {
        match arg {
            syn::FnArg::Receiver(r) => {
                r.attrs.clear();
                // `mut self` binds mutably; `&mut self` is the type.
                if r.reference.is_none() {
                    r.mutability = None;
                }
            }
            syn::FnArg::Typed(t) => {
                t.attrs.clear();
                if let syn::Pat::Ident(p) = &mut *t.pat {
                    p.mutability = None;
                }
            }
        }
    }
    tokens(&sig)
}

/// Kept members: not test code, not `#[doc(hidden)]`.
fn kept(attrs: &[syn::Attribute]) -> bool {
    !is_test(attrs) && !is_hidden(attrs)
}

/// The lines of item `item` at `path`, under `cfgs`: its own line, then
/// one per field, variant or trait item.
pub(crate) fn item_lines(item: &Item, path: &str, cfgs: &[String]) -> Vec<String> {
    let line = |p: &str, own: &[String], text: String| {
        let mut all = cfgs.to_vec();
        all.extend(own.iter().cloned());
        all.sort();
        all.dedup();
        format!("{p}: {}{text}", cfg_prefix(&all))
    };
    let mut out = Vec::new();
    match item {
        Item::Struct(s) => {
            let (g, w) = generics(&s.generics);
            let head = format!("{}pub struct {}{g}", non_exhaustive(&s.attrs), s.ident);
            let shown = |f: &syn::Field| is_pub(&f.vis) && kept(&f.attrs);
            let shape = match &s.fields {
                Fields::Named(f) if f.named.iter().all(shown) => format!("{w} {{ }}"),
                Fields::Named(_) => format!("{w} {{ /* private fields */ }}"),
                Fields::Unnamed(f) => {
                    let each: Vec<String> = f
                        .unnamed
                        .iter()
                        .map(|f| {
                            if shown(f) {
                                format!("pub {}", tokens(&f.ty))
                            } else {
                                "_".into()
                            }
                        })
                        .collect();
                    format!("({}){w}", each.join(", "))
                }
                Fields::Unit => format!("{w};"),
            };
            out.push(line(path, &[], format!("{head}{shape}")));
            for f in s.fields.iter().filter(|f| shown(f)) {
                if let Some(name) = &f.ident {
                    let text = format!("pub {name}: {}", tokens(&f.ty));
                    out.push(line(&format!("{path}::{name}"), &cfgs_of(&f.attrs), text));
                }
            }
            out.extend(derived(&s.attrs, &s.ident, &s.generics, |t| {
                line(path, &[], t)
            }));
        }
        Item::Enum(e) => {
            let (g, w) = generics(&e.generics);
            let text = format!("{}pub enum {}{g}{w}", non_exhaustive(&e.attrs), e.ident);
            out.push(line(path, &[], text));
            for v in e.variants.iter().filter(|v| kept(&v.attrs)) {
                let p = format!("{path}::{}", v.ident);
                out.push(line(&p, &cfgs_of(&v.attrs), variant(v)));
            }
            out.extend(derived(&e.attrs, &e.ident, &e.generics, |t| {
                line(path, &[], t)
            }));
        }
        Item::Union(u) => {
            let (g, w) = generics(&u.generics);
            out.push(line(path, &[], format!("pub union {}{g}{w}", u.ident)));
            out.extend(derived(&u.attrs, &u.ident, &u.generics, |t| {
                line(path, &[], t)
            }));
        }
        Item::Trait(t) => {
            let (g, w) = generics(&t.generics);
            let bounds = bound_list(&t.supertraits);
            let unsafety = if t.unsafety.is_some() { "unsafe " } else { "" };
            out.push(line(
                path,
                &[],
                format!("pub {unsafety}trait {}{g}{bounds}{w}", t.ident),
            ));
            for ti in &t.items {
                if let Some((name, attrs, text)) = trait_item(ti)
                    && kept(attrs)
                {
                    out.push(line(&format!("{path}::{name}"), &cfgs_of(attrs), text));
                }
            }
        }
        Item::Fn(f) => out.push(line(path, &[], format!("pub {}", signature(&f.sig)))),
        Item::Const(c) => {
            out.push(line(
                path,
                &[],
                format!("pub const {}: {}", c.ident, tokens(&c.ty)),
            ));
        }
        Item::Static(s) => {
            let m = if matches!(s.mutability, syn::StaticMutability::Mut(_)) {
                "mut "
            } else {
                ""
            };
            out.push(line(
                path,
                &[],
                format!("pub static {m}{}: {}", s.ident, tokens(&s.ty)),
            ));
        }
        Item::Type(t) => {
            let (g, w) = generics(&t.generics);
            out.push(line(
                path,
                &[],
                format!("pub type {}{g}{w} = {}", t.ident, tokens(&t.ty)),
            ));
        }
        Item::TraitAlias(t) => {
            let mut t = t.clone();
            t.attrs.clear();
            out.push(line(path, &[], tokens(&t)));
        }
        Item::Macro(m) => {
            let name = m
                .ident
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            out.push(line(path, &[], format!("macro_rules! {name}")));
        }
        _ => {}
    }
    out
}

/// `impl Clone for X` for each derived trait, like a written impl.
fn derived(
    attrs: &[syn::Attribute],
    ident: &syn::Ident,
    g: &Generics,
    line: impl Fn(String) -> String,
) -> Vec<String> {
    let (_, args, _) = g.split_for_impl();
    let args = tokens(&args);
    derives(attrs)
        .into_iter()
        .map(|d| line(format!("impl {d} for {ident}{args}")))
        .collect()
}

fn variant(v: &Variant) -> String {
    let fields = |f: &syn::FieldsNamed| -> Vec<String> {
        f.named
            .iter()
            .map(|f| format!("{}: {}", f.ident.as_ref().expect("named"), tokens(&f.ty)))
            .collect()
    };
    let shape = match &v.fields {
        Fields::Named(f) => format!(" {{ {} }}", fields(f).join(", ")),
        Fields::Unnamed(f) => {
            let each: Vec<String> = f.unnamed.iter().map(|f| tokens(&f.ty)).collect();
            format!("({})", each.join(", "))
        }
        Fields::Unit => String::new(),
    };
    let value = v
        .discriminant
        .as_ref()
        .map(|(_, e)| format!(" = {}", tokens(e)));
    format!(
        "{}{}{shape}{}",
        non_exhaustive(&v.attrs),
        v.ident,
        value.unwrap_or_default()
    )
}

fn trait_item(ti: &TraitItem) -> Option<(String, &[syn::Attribute], String)> {
    Some(match ti {
        TraitItem::Fn(f) => {
            let body = if f.default.is_some() { " { .. }" } else { ";" };
            (
                f.sig.ident.to_string(),
                &f.attrs,
                format!("{}{body}", signature(&f.sig)),
            )
        }
        TraitItem::Type(t) => {
            let (g, w) = generics(&t.generics);
            let bounds = bound_list(&t.bounds);
            let default = t
                .default
                .as_ref()
                .map(|(_, ty)| format!(" = {}", tokens(ty)));
            let text = format!(
                "type {}{g}{bounds}{w}{};",
                t.ident,
                default.unwrap_or_default()
            );
            (t.ident.to_string(), &t.attrs, text)
        }
        TraitItem::Const(c) => {
            let default = if c.default.is_some() { " = ..;" } else { ";" };
            let text = format!("const {}: {}{default}", c.ident, tokens(&c.ty));
            (c.ident.to_string(), &c.attrs, text)
        }
        _ => return None,
    })
}

/// The last segment of a type's path (`fmt::Display` reads `Display`), so
/// how a trait or type is imported does not show in the snapshot.
fn short(ty: &Type) -> String {
    match ty {
        Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().map(tokens).unwrap_or_default()
        }
        other => tokens(other),
    }
}

/// An impl's lines: `impl Trait for X` (with its associated types) for a
/// trait impl at `path`, or each `pub fn`/`pub const` of an inherent impl
/// under `path`.
pub(crate) fn impl_lines(imp: &ItemImpl, path: &str, cfgs: &[String]) -> Vec<String> {
    let line = |p: &str, own: &[String], text: String| {
        let mut all = cfgs.to_vec();
        all.extend(own.iter().cloned());
        all.sort();
        all.dedup();
        format!("{p}: {}{text}", cfg_prefix(&all))
    };
    let (g, w) = generics(&imp.generics);
    if let Some((bang, tr, _)) = &imp.trait_ {
        let trait_name = tr.segments.last().map(tokens).unwrap_or_default();
        let assoc: Vec<String> = imp
            .items
            .iter()
            .filter_map(|i| match i {
                ImplItem::Type(t) if kept(&t.attrs) => {
                    Some(format!("type {} = {};", t.ident, tokens(&t.ty)))
                }
                _ => None,
            })
            .collect();
        let body = if assoc.is_empty() {
            String::new()
        } else {
            format!(" {{ {} }}", assoc.join(" "))
        };
        let text = format!(
            "{}impl{g} {}{trait_name} for {}{w}{body}",
            if imp.unsafety.is_some() {
                "unsafe "
            } else {
                ""
            },
            if bang.is_some() { "!" } else { "" },
            short(&imp.self_ty),
        );
        return vec![line(path, &[], text)];
    }
    // The bounds of a generic impl belong to each method's signature.
    let within = if g.is_empty() && w.is_empty() {
        String::new()
    } else {
        format!(" (in impl{g} {}{w})", short(&imp.self_ty))
    };
    let mut out = Vec::new();
    for item in &imp.items {
        match item {
            ImplItem::Fn(f) if is_pub(&f.vis) && kept(&f.attrs) => {
                let p = format!("{path}::{}", f.sig.ident);
                let text = format!("pub {}{within}", signature(&f.sig));
                out.push(line(&p, &cfgs_of(&f.attrs), text));
            }
            ImplItem::Const(c) if is_pub(&c.vis) && kept(&c.attrs) => {
                let p = format!("{path}::{}", c.ident);
                let text = format!("pub const {}: {}", c.ident, tokens(&c.ty));
                out.push(line(&p, &cfgs_of(&c.attrs), text));
            }
            _ => {}
        }
    }
    out
}
