//! Reading a Rust file as text: its tokens without comments and literals, its
//! `#[cfg(test)]` items left out, and every path that starts with `crate`,
//! `super` or `self`.

/// One token: an identifier (`r#` stripped), `::`, or any other single character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) line: usize,
}

/// A path that starts with `crate`, `super` or `self`, expanded out of any
/// `{…}` group: `use crate::{a, b::c}` gives `crate::a` and `crate::b::c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// The segments as written, `crate`/`super`/`self` included.
    pub(crate) path: Vec<String>,
    /// The inline `mod x { … }` blocks the path sits in, outermost first.
    pub(crate) inline_mods: Vec<String>,
    pub(crate) line: usize,
}

/// The tokens of `text`, without whitespace, comments, string, character and
/// number literals, and lifetimes.
pub(crate) fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let (tok, end) = next_token(&c, i);
        let end = end.clamp(i + 1, c.len());
        if let Some(tok) = tok {
            out.push(Token { tok, line });
        }
        line += c[i..end].iter().filter(|&&ch| ch == '\n').count();
        i = end;
    }
    out
}

/// The token that starts at `i` (`None` for what is skipped) and the index
/// after it.
fn next_token(c: &[char], i: usize) -> (Option<Tok>, usize) {
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let until = |from: usize, stop: &dyn Fn(char) -> bool| {
        (from..c.len()).find(|&j| stop(c[j])).unwrap_or(c.len())
    };
    let ch = c[i];
    if ch.is_whitespace() {
        (None, i + 1)
    } else if ch == '/' && at(i + 1) == '/' {
        (None, until(i, &|ch| ch == '\n'))
    } else if ch == '/' && at(i + 1) == '*' {
        let (mut j, mut depth) = (i + 2, 1);
        while j < c.len() && depth > 0 {
            if c[j] == '/' && at(j + 1) == '*' {
                depth += 1;
                j += 2;
            } else if c[j] == '*' && at(j + 1) == '/' {
                depth -= 1;
                j += 2;
            } else {
                j += 1;
            }
        }
        (None, j)
    } else if ch == '"' {
        (None, string_end(c, i + 1))
    } else if ch == '\'' {
        if at(i + 1) == '\\' {
            // '\n', '\'', '\u{..}': up to the closing quote
            (None, until(i + 3, &|ch| ch == '\'') + 1)
        } else if at(i + 2) == '\'' {
            (None, i + 3) // 'x'
        } else {
            // a lifetime or a label: the quote, then its name
            (None, until(i + 1, &|ch| !is_ident(ch)))
        }
    } else if ch.is_ascii_digit() {
        (None, until(i, &|ch| !is_ident(ch)))
    } else if is_ident(ch) {
        let end = until(i, &|ch| !is_ident(ch));
        let word: String = c[i..end].iter().collect();
        let prefix = matches!(word.as_str(), "r" | "br" | "cr" | "b" | "c");
        if prefix && (at(end) == '"' || (at(end) == '#' && word.ends_with('r'))) {
            // a raw or byte string: r"…", r#"…"#, b"…", br#"…"#, c"…"
            let hashes = (end..c.len()).take_while(|&j| c[j] == '#').count();
            let open = end + hashes;
            if at(open) == '"' {
                let stop = if word.ends_with('r') {
                    raw_string_end(c, open + 1, hashes)
                } else {
                    string_end(c, open + 1)
                };
                return (None, stop);
            }
            if word == "r" && hashes == 1 && is_ident(at(open)) {
                // a raw identifier: r#type
                let stop = until(open, &|ch| !is_ident(ch));
                return (Some(Tok::Ident(c[open..stop].iter().collect())), stop);
            }
        }
        if word == "b" && at(end) == '\'' {
            // a byte: b'x', b'\n'
            return (None, until(end + 2, &|ch| ch == '\'') + 1);
        }
        (Some(Tok::Ident(word)), end)
    } else if ch == ':' && at(i + 1) == ':' {
        (Some(Tok::PathSep), i + 2)
    } else {
        (Some(Tok::Punct(ch)), i + 1)
    }
}

fn is_ident(ch: char) -> bool {
    ch == '_' || ch.is_alphanumeric()
}

/// The index just past the closing quote of a string whose body starts at `i`.
fn string_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    c.len()
}

/// The index just past `"` and `hashes` `#` that close a raw string.
fn raw_string_end(c: &[char], mut i: usize, hashes: usize) -> usize {
    while i < c.len() {
        if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    c.len()
}

fn is(t: Option<&Token>, want: &Tok) -> bool {
    t.is_some_and(|t| &t.tok == want)
}

fn ident(s: &str) -> Tok {
    Tok::Ident(s.to_owned())
}

/// Whether the tokens at `i` are `#[cfg(test)]` (outer) or `#![cfg(test)]`
/// (inner); returns the index past it and whether it is inner.
fn cfg_test_at(t: &[Token], i: usize) -> Option<(usize, bool)> {
    if !is(t.get(i), &Tok::Punct('#')) {
        return None;
    }
    let inner = is(t.get(i + 1), &Tok::Punct('!'));
    let j = i + 1 + usize::from(inner);
    let want = [
        Tok::Punct('['),
        ident("cfg"),
        Tok::Punct('('),
        ident("test"),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    want.iter()
        .enumerate()
        .all(|(k, w)| is(t.get(j + k), w))
        .then_some((j + want.len(), inner))
}

/// Leaves out test code: every item under `#[cfg(test)]` (a `mod tests { … }`,
/// a function, a `use`), and the whole file under `#![cfg(test)]`.
pub(crate) fn strip_cfg_test(t: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let Some((mut j, inner)) = cfg_test_at(t, i) else {
            out.push(t[i].clone());
            i += 1;
            continue;
        };
        if inner {
            return Vec::new();
        }
        // The item: its other attributes, then up to a `;` outside brackets or
        // the `}` that closes its body.
        let mut depth = 0usize;
        while j < t.len() {
            match t[j].tok {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
                // the enclosing block's brace: the item ended without one
                Tok::Punct('}') if depth == 0 => break,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        i = j;
    }
    out
}

/// Every path starting with `crate`, `$crate`, `super` or `self` (followed by
/// `::`), in `use` trees and in code, with the inline modules it sits in.
pub(crate) fn references(t: &[Token]) -> Vec<Reference> {
    let mut out = Vec::new();
    let mut mods: Vec<(String, usize)> = Vec::new(); // (name, brace depth outside it)
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match &t[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if mods.last().is_some_and(|(_, d)| *d == depth) {
                    mods.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), true) = (
                    t.get(i + 1).map(|n| &n.tok),
                    is(t.get(i + 2), &Tok::Punct('{')),
                ) {
                    mods.push((name.clone(), depth));
                }
            }
            Tok::Ident(head)
                if matches!(head.as_str(), "crate" | "super" | "self")
                    && is(t.get(i + 1), &Tok::PathSep)
                    && !(i > 0 && is(t.get(i - 1), &Tok::PathSep)) =>
            {
                let mut paths = Vec::new();
                let next = use_tree(t, i, Vec::new(), &mut paths);
                let inline_mods: Vec<String> = mods.iter().map(|(m, _)| m.clone()).collect();
                out.extend(paths.into_iter().map(|path| Reference {
                    path,
                    inline_mods: inline_mods.clone(),
                    line: t[i].line,
                }));
                // The group's braces were consumed by `use_tree`: go on after it.
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Reads one path or use tree at `i` (after `prefix`), pushing each full path
/// into `out`; returns the index after it. `{…}` groups are expanded, `*` and
/// `as name` end a path.
fn use_tree(t: &[Token], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    loop {
        match t.get(i).map(|x| &x.tok) {
            Some(Tok::Ident(s)) if s != "as" => {
                path.push(s.clone());
                i += 1;
                if is(t.get(i), &Tok::PathSep) {
                    i += 1;
                    continue;
                }
                out.push(path);
                return i;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < t.len() && !is(t.get(i), &Tok::Punct('}')) {
                    let before = i;
                    i = use_tree(t, i, path.clone(), out);
                    if is(t.get(i), &Tok::Ident("as".into())) {
                        i += 2; // `as name`
                    }
                    if is(t.get(i), &Tok::Punct(',')) {
                        i += 1;
                    } else if i == before {
                        i += 1; // not a use tree: do not stall
                    }
                }
                return i + 1;
            }
            Some(Tok::Punct('*')) => {
                out.push(path); // a glob: the module itself
                return i + 1;
            }
            _ => {
                // `<` of a turbofish, `as`, or the end: the path so far
                out.push(path);
                return i;
            }
        }
    }
}

/// The absolute module path (segments under the crate root) that `path` names
/// from module `here`, or `None` when it climbs above the crate root.
pub(crate) fn resolve(path: &[String], here: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut out = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here.split_last()?.1.to_vec(),
        _ => return None,
    };
    for seg in rest {
        match seg.as_str() {
            "super" => {
                out.pop()?;
            }
            "self" => {}
            _ => out.push(seg.clone()),
        }
    }
    Some(out)
}
