//! Table, view and column names, resolved once from the options.

use std::collections::HashMap;

use crate::error::Error;

/// The standard columns every job table has, by their default names.
pub const STANDARD_COLUMNS: [&str; 13] = [
    "id",
    "state",
    "failure_message",
    "queued_at",
    "started_at",
    "finished_at",
    "process_after",
    "num_resets",
    "num_failures",
    "last_heartbeat_at",
    "execution_logs",
    "worker_hostname",
    "cancel",
];

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
    const MAX: usize = 63;
    if name.len() <= MAX {
        return name.to_owned();
    }
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!("_{:08x}", hash & 0xffff_ffff);
    let mut cut = MAX - suffix.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &name[..cut])
}

/// Whether `s` is a plain SQL identifier (letters, digits, `_`, `$`; not starting with a digit).
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        && s.len() <= 63
}

/// The names of the standard columns after `alternate_column_names`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Columns {
    pub(crate) id: String,
    pub(crate) state: String,
    pub(crate) failure_message: String,
    pub(crate) queued_at: String,
    pub(crate) started_at: String,
    pub(crate) finished_at: String,
    pub(crate) process_after: String,
    pub(crate) num_resets: String,
    pub(crate) num_failures: String,
    pub(crate) last_heartbeat_at: String,
    pub(crate) execution_logs: String,
    pub(crate) worker_hostname: String,
    pub(crate) cancel: String,
}

impl Columns {
    /// Applies the renames; every key must be a standard column and every value
    /// an identifier (plain, or double-quoted: `"order"`), taken unquoted.
    pub(crate) fn resolve(renames: &HashMap<String, String>) -> Result<Columns, Error> {
        let mut unquoted = HashMap::with_capacity(renames.len());
        for (from, to) in renames {
            if !STANDARD_COLUMNS.contains(&from.as_str()) {
                return Err(Error::InvalidOption {
                    field: "alternate_column_names",
                    reason: format!(
                        "{from:?} is not a standard column (one of {})",
                        STANDARD_COLUMNS.join(", ")
                    ),
                });
            }
            let Some(to) = parse_identifier(to) else {
                return Err(Error::InvalidOption {
                    field: "alternate_column_names",
                    reason: format!("{to:?} (for {from:?}) is not a plain or quoted identifier"),
                });
            };
            unquoted.insert(from.as_str(), to);
        }
        let name = |c: &str| unquoted.get(c).cloned().unwrap_or_else(|| c.to_owned());
        // Two standard columns under one name would make every statement wrong.
        let mut seen: HashMap<String, &str> = HashMap::new();
        for standard in STANDARD_COLUMNS {
            if let Some(other) = seen.insert(name(standard), standard) {
                return Err(Error::InvalidOption {
                    field: "alternate_column_names",
                    reason: format!(
                        "standard columns {other} and {standard} would both be named {:?}; every standard column needs its own column",
                        name(standard)
                    ),
                });
            }
        }
        Ok(Columns {
            id: name("id"),
            state: name("state"),
            failure_message: name("failure_message"),
            queued_at: name("queued_at"),
            started_at: name("started_at"),
            finished_at: name("finished_at"),
            process_after: name("process_after"),
            num_resets: name("num_resets"),
            num_failures: name("num_failures"),
            last_heartbeat_at: name("last_heartbeat_at"),
            execution_logs: name("execution_logs"),
            worker_hostname: name("worker_hostname"),
            cancel: name("cancel"),
        })
    }

    /// Each standard column with its resolved name and the types it may have
    /// (as `information_schema.columns.udt_name`).
    pub(crate) fn expected_types(&self) -> Vec<(&'static str, &str, &'static [&'static str])> {
        const TS: &[&str] = &["timestamptz"];
        const TEXT: &[&str] = &["text", "varchar"];
        const INT: &[&str] = &["int4", "int8", "int2"];
        vec![
            ("id", &self.id, &["int8"]),
            ("state", &self.state, TEXT),
            ("failure_message", &self.failure_message, TEXT),
            ("queued_at", &self.queued_at, TS),
            ("started_at", &self.started_at, TS),
            ("finished_at", &self.finished_at, TS),
            ("process_after", &self.process_after, TS),
            ("num_resets", &self.num_resets, INT),
            ("num_failures", &self.num_failures, INT),
            ("last_heartbeat_at", &self.last_heartbeat_at, TS),
            ("execution_logs", &self.execution_logs, &["_json"]),
            ("worker_hostname", &self.worker_hostname, TEXT),
            ("cancel", &self.cancel, &["bool"]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_relations() {
        let r = Relation::parse("table_name", "example_jobs j").unwrap();
        assert_eq!(
            (r.schema, r.name.as_str(), r.alias.as_str()),
            (None, "example_jobs", "j")
        );
        let r = Relation::parse("table_name", "app.jobs AS x").unwrap();
        assert_eq!(
            (r.schema.as_deref(), r.name.as_str(), r.alias.as_str()),
            (Some("app"), "jobs", "x")
        );
        let r = Relation::parse("table_name", "jobs").unwrap();
        assert_eq!(r.alias, "jobs");
        assert!(Relation::parse("table_name", "jobs; drop table x").is_err());
        assert!(Relation::parse("table_name", "").is_err());
        assert!(Relation::parse("table_name", "a b c d").is_err());
        let r = Relation::parse("table_name", "jobs as j").unwrap();
        assert_eq!(r.alias, "j");
        for bad in [
            "jobs AS",
            "jobs as",
            "jobs where",
            "jobs j where",
            "AS j",
            "jobs JOIN",
        ] {
            let err = Relation::parse("table_name", bad).unwrap_err().to_string();
            assert!(err.contains("table_name"), "{bad}: {err}");
        }
        let err = Relation::parse("table_name", "jobs AS")
            .unwrap_err()
            .to_string();
        assert!(err.contains("table AS alias"), "{err}");
    }

    #[test]
    fn parses_quoted_relations() {
        let parts = |text: &str| {
            let r = Relation::parse("table_name", text).unwrap();
            (r.schema, r.name, r.alias)
        };
        let owned = |s: &str| s.to_owned();
        assert_eq!(parts("\"order\""), (None, owned("order"), owned("order")));
        assert_eq!(
            parts("app.\"select\""),
            (Some(owned("app")), owned("select"), owned("select"))
        );
        assert_eq!(
            parts("\"My Table\" t"),
            (None, owned("My Table"), owned("t"))
        );
        assert_eq!(
            parts("\"my.schema\".\"we\"\"ird\" AS \"where\""),
            (Some(owned("my.schema")), owned("we\"ird"), owned("where"))
        );
        assert_eq!(
            parts("\"app\" . jobs as j"),
            (Some(owned("app")), owned("jobs"), owned("j"))
        );
        // Keywords after a dot were always taken; they still are.
        assert_eq!(
            parts("app.order"),
            (Some(owned("app")), owned("order"), owned("order"))
        );
        // A quoted `as` is an alias, not the keyword.
        assert_eq!(parts("jobs \"as\""), (None, owned("jobs"), owned("as")));
        let r = Relation::parse("table_name", "app.\"My Table\" t").unwrap();
        assert_eq!(r.quoted(), "\"app\".\"My Table\"");
        assert_eq!(r.display_name(), "app.\"My Table\"");
        let r = Relation::parse("table_name", "\"order\"").unwrap();
        assert_eq!(r.quoted(), "\"order\"");
        assert_eq!(r.display_name(), "order");
        assert_eq!(
            Relation::parse("table_name", "app.jobs j")
                .unwrap()
                .display_name(),
            "app.jobs"
        );

        // Unquoted keywords are still typos, with the same message.
        for (bad, word) in [
            ("order", "order"),
            ("jobs where", "where"),
            ("\"order\" select", "select"),
        ] {
            let err = Relation::parse("table_name", bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "{word:?} is an SQL keyword, not a table name or alias"
                )),
                "{bad}: {err}"
            );
        }
        for bad in [
            "\"order",
            "\"\"",
            "\"a\"b",
            "a\"b\"",
            "\"a\nb\"",
            "a..b",
            "a.b.c",
            ".a",
            "a.",
            "\"order\" AS",
            "\"order\"; drop table x",
        ] {
            let err = Relation::parse("table_name", bad).unwrap_err().to_string();
            assert!(err.contains("table_name"), "{bad}: {err}");
        }
        let long = format!("\"{}\"", "x".repeat(64));
        assert!(Relation::parse("table_name", &long).is_err());
    }

    #[test]
    fn parses_quoted_columns() {
        assert_eq!(parse_identifier("queue").as_deref(), Some("queue"));
        assert_eq!(parse_identifier("\"order\"").as_deref(), Some("order"));
        assert_eq!(
            parse_identifier(" \"My \"\"Col\"\"\" ").as_deref(),
            Some("My \"Col\"")
        );
        for bad in ["", "a b", "\"a", "a.b", "\"\"", "1a"] {
            assert_eq!(parse_identifier(bad), None, "{bad}");
        }
        assert_eq!(
            parse_dotted("j.\"order\""),
            Some(vec!["j".to_owned(), "order".to_owned()])
        );
        assert_eq!(parse_dotted("queue"), Some(vec!["queue".to_owned()]));
        for bad in ["", "j.", ".q", "j..q", "j q"] {
            assert_eq!(parse_dotted(bad), None, "{bad}");
        }
        let err = column_name("queue_column", "no spaces")
            .unwrap_err()
            .to_string();
        assert!(err.contains("queue_column"), "{err}");
        let renames = HashMap::from([("state".to_owned(), "\"Status\"".to_owned())]);
        assert_eq!(Columns::resolve(&renames).unwrap().state, "Status");
        // Quoted or not, a rename onto a standard name is caught.
        let renames = HashMap::from([("state".to_owned(), "\"id\"".to_owned())]);
        assert!(Columns::resolve(&renames).is_err());
        assert_eq!(literal("it's"), "'it''s'");
    }

    #[test]
    fn renames_apply_and_are_checked() {
        let mut renames = HashMap::new();
        renames.insert("state".to_owned(), "status".to_owned());
        let c = Columns::resolve(&renames).unwrap();
        assert_eq!(c.state, "status");
        assert_eq!(c.id, "id");
        renames.insert("colour".to_owned(), "x".to_owned());
        let err = Columns::resolve(&renames).unwrap_err().to_string();
        assert!(err.contains("\"colour\" is not a standard column"), "{err}");
        let mut bad = HashMap::new();
        bad.insert("state".to_owned(), "st ate".to_owned());
        assert!(Columns::resolve(&bad).is_err());
        // A rename onto another standard column, or two renames onto one name.
        for pairs in [vec![("state", "id")], vec![("state", "s"), ("cancel", "s")]] {
            let renames: HashMap<String, String> = pairs
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect();
            let err = Columns::resolve(&renames).unwrap_err().to_string();
            assert!(err.contains("would both be named"), "{err}");
        }
        // Swapping two names is fine: each standard column still has its own.
        let swap: HashMap<String, String> = [("state", "cancel"), ("cancel", "state")]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        assert!(Columns::resolve(&swap).is_ok());
    }
}
