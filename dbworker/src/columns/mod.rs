//! Table, view and column names, resolved once from the options.

use std::collections::HashMap;

use crate::error::Error;

mod fairness;
mod names;
mod partitions;
mod progress;
mod workflow;

pub(crate) use fairness::*;
pub(crate) use names::*;
pub(crate) use partitions::*;
pub(crate) use progress::*;
pub(crate) use workflow::*;

/// The pause table's standard name (`dbworker migration --pauses`): every
/// job table adopts it when it exists, so no worker misses a pause.
pub(crate) const STANDARD_PAUSE_TABLE: &str = "dbworker_pauses";

/// The limit table's standard name (`dbworker migration --limits`), adopted
/// like the pause table by every job table that can apply limits.
pub(crate) const STANDARD_LIMIT_TABLE: &str = "dbworker_limits";

/// The HOT layout's generated column: whether the row is live (queued,
/// errored or processing). A claim leaves it true, so the only index the
/// layout keeps on the state reads it and the claim can be a HOT update.
pub(crate) const LIVE: &str = "dbworker_live";

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
    /// The table has the generated column [`LIVE`] and the HOT layout's
    /// index over it (`dbworker migration --hot-layout`): the claim, the
    /// probe and the resetter name it, so they read that index.
    pub(crate) live: bool,
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
            live: false,
        })
    }

    /// These names on a relation without the HOT layout's column (a view).
    pub(crate) fn without_live(&self) -> Columns {
        Columns {
            live: false,
            ..self.clone()
        }
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
