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
    pub(crate) fn parse(field: &'static str, text: &str) -> Result<Relation, Error> {
        let invalid = |reason: &str| Error::InvalidOption {
            field,
            reason: format!("{reason}: {text:?}"),
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        let (qualified, alias) = match parts.as_slice() {
            [name] => (*name, None),
            [name, alias] if !alias.eq_ignore_ascii_case("as") => (*name, Some(*alias)),
            [name, as_kw, alias] if as_kw.eq_ignore_ascii_case("as") => (*name, Some(*alias)),
            _ => {
                return Err(invalid(
                    "expected `table`, `schema.table`, `table alias` or `table AS alias`",
                ));
            }
        };
        for word in [Some(qualified), alias].into_iter().flatten() {
            if is_reserved(word) {
                return Err(invalid(&format!(
                    "{word:?} is an SQL keyword, not a table name or alias"
                )));
            }
        }
        let (schema, name) = match qualified.split_once('.') {
            Some((s, n)) => (Some(s.to_owned()), n.to_owned()),
            None => (None, qualified.to_owned()),
        };
        for ident in [Some(name.as_str()), schema.as_deref(), alias]
            .into_iter()
            .flatten()
        {
            if !is_identifier(ident) {
                return Err(invalid(&format!("{ident:?} is not a plain identifier")));
            }
        }
        Ok(Relation {
            alias: alias.map_or_else(|| name.clone(), str::to_owned),
            schema,
            name,
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

    /// The qualified name for messages: `schema.name` or `name`.
    pub(crate) fn display_name(&self) -> String {
        match &self.schema {
            Some(s) => format!("{s}.{}", self.name),
            None => self.name.clone(),
        }
    }
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
    /// an identifier.
    pub(crate) fn resolve(renames: &HashMap<String, String>) -> Result<Columns, Error> {
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
            if !is_identifier(to) {
                return Err(Error::InvalidOption {
                    field: "alternate_column_names",
                    reason: format!("{to:?} (for {from:?}) is not a plain identifier"),
                });
            }
        }
        let name = |c: &str| renames.get(c).cloned().unwrap_or_else(|| c.to_owned());
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
