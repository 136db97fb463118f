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
            [name, alias] => (*name, Some(*alias)),
            [name, as_kw, alias] if as_kw.eq_ignore_ascii_case("as") => (*name, Some(*alias)),
            _ => return Err(invalid("expected `table`, `schema.table` or `table alias`")),
        };
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

    /// The qualified name for messages: `schema.name` or `name`.
    pub(crate) fn display_name(&self) -> String {
        match &self.schema {
            Some(s) => format!("{s}.{}", self.name),
            None => self.name.clone(),
        }
    }
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
            ("id", &self.id, &["int4", "int8"]),
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
    }
}
