//! Names as SQL takes them: relations (`schema.name alias`), plain and
//! double-quoted identifiers, quoting, and names bounded to 63 bytes.

use crate::error::Error;

/// A table or view reference: optional schema, name, and the alias queries use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    /// The schema, when qualified (`"app.jobs"`).
    pub(crate) schema: Option<String>,
    /// The table or view name.
    pub(crate) name: String,
    /// The alias used in queries; the name itself when none was given.
    pub(crate) alias: String,
}

impl Relation {
    /// Parses `"name"`, `"schema.name"`, `"name alias"` or `"name AS alias"`.
    /// Each part is a plain identifier or a double-quoted one (`"order"`,
    /// `app."My Table" t`), kept unquoted: [`Relation::quoted`] quotes it again.
    pub(crate) fn parse(field: &'static str, text: &str) -> Result<Relation, Error> {
        use Token::{Dot, Word as W};
        let invalid = |reason: &str| Error::InvalidOption {
            field,
            reason: format!("{reason}: {text:?}"),
        };
        let tokens = lex(text).map_err(&invalid)?;
        let is_as = |w: &Word| !w.quoted && w.text.eq_ignore_ascii_case("as");
        let (schema, name, alias) = match tokens.as_slice() {
            [W(n)] => (None, n, None),
            [W(s), Dot, W(n)] => (Some(s), n, None),
            [W(n), W(a)] if !is_as(a) => (None, n, Some(a)),
            [W(s), Dot, W(n), W(a)] if !is_as(a) => (Some(s), n, Some(a)),
            [W(n), W(k), W(a)] if is_as(k) => (None, n, Some(a)),
            [W(s), Dot, W(n), W(k), W(a)] if is_as(k) => (Some(s), n, Some(a)),
            _ => {
                return Err(invalid(
                    "expected `table`, `schema.table`, `table alias` or `table AS alias`",
                ));
            }
        };
        // A bare keyword is a typo (`"jobs where"`); a quoted one is a name.
        let bare_name = schema.is_none().then_some(name);
        for word in [bare_name, alias].into_iter().flatten() {
            if !word.quoted && is_reserved(&word.text) {
                return Err(invalid(&format!(
                    "{:?} is an SQL keyword, not a table name or alias",
                    word.text
                )));
            }
        }
        for word in [Some(name), schema, alias].into_iter().flatten() {
            word.check().map_err(|reason| invalid(&reason))?;
        }
        Ok(Relation {
            alias: alias.unwrap_or(name).text.clone(),
            schema: schema.map(|s| s.text.clone()),
            name: name.text.clone(),
        })
    }

    /// The relation quoted for SQL: `"schema"."name"` or `"name"`.
    pub(crate) fn quoted(&self) -> String {
        self.quoted_sibling(&self.name)
    }

    /// The name of an object derived from this relation, `<name>_<suffix>`,
    /// kept within Postgres's identifier length.
    pub(crate) fn derived(&self, suffix: &str) -> String {
        bounded_name(&format!("{}_{suffix}", self.name))
    }

    /// [`derived`](Self::derived), quoted (an index or trigger: in the
    /// relation's schema by definition).
    pub(crate) fn quoted_derived(&self, suffix: &str) -> String {
        quote(&self.derived(suffix))
    }

    /// [`derived`](Self::derived), quoted in this relation's schema (a
    /// function, a sequence, a table).
    pub(crate) fn quoted_derived_sibling(&self, suffix: &str) -> String {
        self.quoted_sibling(&self.derived(suffix))
    }

    /// Another object `name` (a function, a trigger) quoted in this
    /// relation's schema.
    pub(crate) fn quoted_sibling(&self, name: &str) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(name)),
            None => quote(name),
        }
    }

    /// The qualified name for messages and keys (pauses, limits, cron):
    /// `schema.name` or `name`, each part quoted only when it is not a plain
    /// identifier (`"My Table"`), so distinct relations keep distinct names.
    pub(crate) fn display_name(&self) -> String {
        let part = |p: &str| {
            if is_identifier(p) {
                p.to_owned()
            } else {
                quote(p)
            }
        };
        match &self.schema {
            Some(s) => format!("{}.{}", part(s), part(&self.name)),
            None => part(&self.name),
        }
    }
}

/// A word of an option naming a relation or column: its text (unquoted) and
/// whether it was double-quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Word {
    text: String,
    quoted: bool,
}

impl Word {
    /// A plain word must be a plain identifier; a quoted one may hold any
    /// printable characters, 1 to 63 bytes (Postgres would cut a longer one).
    fn check(&self) -> Result<(), String> {
        if self.quoted {
            if self.text.is_empty()
                || self.text.len() > 63
                || self.text.chars().any(char::is_control)
            {
                return Err(format!(
                    "{:?} is not a quoted identifier of 1 to 63 bytes without control characters",
                    self.text
                ));
            }
        } else if self.text.len() > 63 && identifier_chars(&self.text) {
            return Err(format!(
                "{:?} is {} bytes, over PostgreSQL's limit of 63 for a name (it would cut it to 63)",
                self.text,
                self.text.len()
            ));
        } else if !is_identifier(&self.text) {
            return Err(format!("{:?} is not a plain identifier", self.text));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(Word),
    Dot,
}

/// Splits option text into words and dots. A word is plain (up to a blank,
/// a dot or a quote) or double-quoted, with `""` standing for a quote; a word
/// ends at a blank, a dot or the end.
fn lex(text: &str) -> Result<Vec<Token>, &'static str> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == '.' {
            chars.next();
            tokens.push(Token::Dot);
            continue;
        }
        let word = if c == '"' {
            chars.next();
            let mut unquoted = String::new();
            loop {
                match chars.next() {
                    None => return Err("a quoted identifier is not closed"),
                    Some((_, '"')) if chars.peek().is_some_and(|&(_, c)| c == '"') => {
                        chars.next();
                        unquoted.push('"');
                    }
                    Some((_, '"')) => break,
                    Some((_, c)) => unquoted.push(c),
                }
            }
            Word {
                text: unquoted,
                quoted: true,
            }
        } else {
            let mut end = text.len();
            while let Some(&(i, c)) = chars.peek() {
                if c.is_whitespace() || c == '.' || c == '"' {
                    end = i;
                    break;
                }
                chars.next();
            }
            Word {
                text: text[start..end].to_owned(),
                quoted: false,
            }
        };
        if chars
            .peek()
            .is_some_and(|&(_, c)| !c.is_whitespace() && c != '.')
        {
            return Err("a quoted identifier must be a whole word");
        }
        tokens.push(Token::Word(word));
    }
    Ok(tokens)
}

/// One identifier as an option gives it, unquoted: a plain identifier as it
/// is, or a double-quoted one (`"order"`, `"My Column"`) without its quotes.
/// `None` if the text is anything else.
pub(crate) fn parse_identifier(text: &str) -> Option<String> {
    match lex(text).ok()?.as_slice() {
        [Token::Word(w)] if w.check().is_ok() => Some(w.text.clone()),
        _ => None,
    }
}

/// Dotted identifiers (`j.queue`, `j."order"`), each unquoted; `None` if the
/// text is anything else.
pub(crate) fn parse_dotted(text: &str) -> Option<Vec<String>> {
    let tokens = lex(text).ok()?;
    let mut parts = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::Word(w) if i % 2 == 0 && w.check().is_ok() => parts.push(w.text.clone()),
            Token::Dot if i % 2 == 1 => {}
            _ => return None,
        }
    }
    (tokens.len() % 2 == 1).then_some(parts)
}

/// A column option resolved: the name unquoted, or an error naming `field`.
pub(crate) fn column_name(field: &'static str, text: &str) -> Result<String, Error> {
    parse_identifier(text).ok_or_else(|| Error::InvalidOption {
        field,
        reason: format!("{text:?} is not an identifier (plain, or double-quoted)"),
    })
}

/// A string as an SQL literal: `'it''s'`.
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Quotes an identifier for SQL.
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Reserved words that can be neither a table name nor an alias without quotes
/// (the ones a typo in `"jobs j"` could plausibly produce).
fn is_reserved(word: &str) -> bool {
    const RESERVED: &[&str] = &[
        "all",
        "and",
        "as",
        "asc",
        "by",
        "case",
        "cross",
        "desc",
        "distinct",
        "else",
        "end",
        "except",
        "for",
        "from",
        "full",
        "group",
        "having",
        "in",
        "inner",
        "intersect",
        "is",
        "join",
        "left",
        "limit",
        "natural",
        "not",
        "null",
        "offset",
        "on",
        "or",
        "order",
        "outer",
        "right",
        "select",
        "table",
        "then",
        "union",
        "using",
        "when",
        "where",
        "with",
    ];
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(word))
}

/// `name` if it fits Postgres's 63-byte identifiers, else a prefix of it and a
/// hash of the whole, so distinct long names stay distinct (Postgres would
/// silently truncate them to the same name).
pub(crate) fn bounded_name(name: &str) -> String {
    bounded_name_to(name, 63)
}

/// [`bounded_name`] within `max` bytes (leaving room for a suffix added later,
/// like a partition's date).
pub(crate) fn bounded_name_to(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_owned();
    }
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!("_{:08x}", hash & 0xffff_ffff);
    let mut cut = max - suffix.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &name[..cut])
}

/// Whether `s` is a plain SQL identifier (letters, digits, `_`, `$`; not starting with a digit).
pub(crate) fn is_identifier(s: &str) -> bool {
    identifier_chars(s) && s.len() <= 63
}

/// Whether `s` is made of what a plain identifier may hold, whatever its length.
fn identifier_chars(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests {
    use super::Relation;

    #[test]
    fn a_name_over_63_bytes_is_refused_saying_so() {
        let long = "j".repeat(64);
        let err = Relation::parse("table_name", &long)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("64 bytes") && err.contains("limit of 63"),
            "{err}"
        );
        assert!(Relation::parse("table_name", &"j".repeat(63)).is_ok());
        let err = Relation::parse("table_name", "jobs-2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a plain identifier"), "{err}");
    }
}
