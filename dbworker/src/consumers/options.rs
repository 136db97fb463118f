//! `LogOptions`: the events table, the consumers and their control tables.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sqlx::FromRow;
use sqlx::postgres::PgRow;

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::sql::{self, LogTables};

use crate::consumers::store::{DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE};

/// The events table's transaction column by default.
pub const DEFAULT_TRANSACTION_COLUMN: &str = "transaction_id";

/// An event type a `LogStore` scans rows into (any `sqlx::FromRow` type).
pub trait LogEvent: for<'r> FromRow<'r, PgRow> + Send + Sync + Unpin + 'static {}

impl<E> LogEvent for E where E: for<'r> FromRow<'r, PgRow> + Send + Sync + Unpin + 'static {}

/// How a `LogStore` reads the log. Usually built by `ConsumerGroup`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LogOptions {
    /// The store's name, for logs.
    pub name: String,
    /// The events table, with an optional alias (`"events e"`).
    pub events_table: String,
    /// The global position column: increasing, unique, indexed. Default
    /// `global_position`.
    pub position_column: String,
    /// The `xid8` column holding the writing transaction's id (`DEFAULT
    /// pg_current_xact_id()`), indexed with the position: events are read in
    /// `(transaction, position)` order once their transaction can no longer
    /// be preceded. Default `transaction_id`.
    pub transaction_column: String,
    /// The select list an event is scanned from (`FromRow`). Default: every
    /// column (`<alias>.*`).
    pub column_expressions: Vec<String>,
    /// This process's node id (`Node::id`): the assignments it acts on.
    pub node_id: String,
    /// Every consumer of the group, by name.
    pub consumers: Vec<String>,
    /// The assignment table. Default [`DEFAULT_ASSIGNMENT_TABLE`].
    pub assignment_table: String,
    /// The checkpoint table. Default [`DEFAULT_CHECKPOINT_TABLE`].
    pub checkpoint_table: String,
    /// Events per slice at most. Default 100.
    pub slice_size: u32,
    /// Pause after a consumer's slice before its next one. Default 200 ms.
    pub slice_pause: Duration,
    /// Wait after a failed slice before it is tried again from the same
    /// position. Default 1 s.
    pub retry_after: Duration,
    /// A consumer failing this many slices in a row stops the group (the
    /// process should exit and be looked at). Default 5.
    pub max_consecutive_failures: u32,
    /// The aggregate types each scoped consumer reads, by consumer name (the
    /// seed's `ScopedConsumer`; `ConsumerGroup` fills it from
    /// `Consumer::aggregate_types`). A consumer absent here, or with no types,
    /// reads every event. The slice filters in SQL (`aggregate_type_column =
    /// ANY($types)`), so a scoped consumer never receives the other events, and
    /// its checkpoint still advances past them (to the head of the log read
    /// in the slice's transaction). Default: none.
    pub scopes: BTreeMap<String, Vec<String>>,
    /// The column scoped consumers' types are matched against. Default
    /// `aggregate_type`.
    pub aggregate_type_column: String,
    /// The NOTIFY channel the events table's trigger uses (see
    /// `events_table_sql`); `None`: poll only. In a `ConsumerGroup` the
    /// process's `LogDispatcher` listens on it instead of the store.
    pub listen: Option<String>,
    /// How long the listener waits for a connection. Default 5 s.
    pub connect_timeout: Duration,
}

impl LogOptions {
    /// Options for `events_table`, run by node `node_id` for `consumers`.
    pub fn new(
        name: impl Into<String>,
        events_table: impl Into<String>,
        node_id: impl Into<String>,
        consumers: Vec<String>,
    ) -> Self {
        LogOptions {
            name: name.into(),
            events_table: events_table.into(),
            position_column: "global_position".into(),
            transaction_column: DEFAULT_TRANSACTION_COLUMN.into(),
            column_expressions: Vec::new(),
            node_id: node_id.into(),
            consumers,
            assignment_table: DEFAULT_ASSIGNMENT_TABLE.into(),
            checkpoint_table: DEFAULT_CHECKPOINT_TABLE.into(),
            slice_size: 100,
            slice_pause: Duration::from_millis(200),
            retry_after: Duration::from_secs(1),
            max_consecutive_failures: 5,
            scopes: BTreeMap::new(),
            aggregate_type_column: "aggregate_type".into(),
            listen: None,
            connect_timeout: crate::table::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        self.resolve().map(|_| ())
    }

    pub(crate) fn resolve(&self) -> Result<LogResolved> {
        let invalid = |field, reason: &str| Error::InvalidOption {
            field,
            reason: reason.to_owned(),
        };
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if self.node_id.trim().is_empty() {
            return Err(invalid("node_id", "must not be empty"));
        }
        if self.consumers.is_empty() {
            return Err(invalid("consumers", "name at least one consumer"));
        }
        let mut names = self.consumers.clone();
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) || names.iter().any(|n| n.trim().is_empty()) {
            return Err(invalid("consumers", "names must be unique and not empty"));
        }
        let position_column =
            crate::columns::column_name("position_column", &self.position_column)?;
        let transaction_column =
            crate::columns::column_name("transaction_column", &self.transaction_column)?;
        if self.slice_size == 0 {
            return Err(invalid("slice_size", "must be at least 1"));
        }
        // Added to the clock under the books' lock: a panic there poisons it.
        Error::check_max_durations([
            ("slice_pause", self.slice_pause),
            ("retry_after", self.retry_after),
            ("connect_timeout", self.connect_timeout),
        ])?;
        if self.max_consecutive_failures == 0 {
            return Err(invalid("max_consecutive_failures", "must be at least 1"));
        }
        if let Some(ch) = &self.listen
            && !crate::columns::is_identifier(ch)
        {
            return Err(invalid("listen", "must be a plain identifier"));
        }
        let type_column =
            crate::columns::column_name("aggregate_type_column", &self.aggregate_type_column)?;
        let mut scopes = HashMap::new();
        for (consumer, types) in &self.scopes {
            if names.binary_search(consumer).is_err() {
                return Err(invalid(
                    "scopes",
                    "names a consumer that is not in `consumers`",
                ));
            }
            if types.iter().any(|t| t.is_empty()) {
                return Err(invalid("scopes", "an aggregate type must not be empty"));
            }
            if !types.is_empty() {
                scopes.insert(consumer.clone(), types.clone());
            }
        }
        let events = Relation::parse("events_table", &self.events_table)?;
        let column_expressions = if self.column_expressions.is_empty() {
            vec![format!("{}.*", sql::quote(&events.alias))]
        } else {
            self.column_expressions.clone()
        };
        Ok(LogResolved {
            name: self.name.clone(),
            tables: LogTables {
                position_column,
                transaction_column,
                column_expressions,
                assignments: Relation::parse("assignment_table", &self.assignment_table)?,
                checkpoints: Relation::parse("checkpoint_table", &self.checkpoint_table)?,
                events,
                type_column,
            },
            node_id: self.node_id.clone(),
            consumers: names,
            scopes,
            slice_size: self.slice_size,
            slice_pause: self.slice_pause,
            retry_after: self.retry_after,
            max_consecutive_failures: self.max_consecutive_failures,
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct LogResolved {
    pub(crate) name: String,
    /// What the consumers' statements need.
    pub(crate) tables: LogTables,
    pub(crate) node_id: String,
    /// Sorted; a consumer's index is its record id.
    pub(crate) consumers: Vec<String>,
    /// The scoped consumers' aggregate types (never empty lists).
    pub(crate) scopes: HashMap<String, Vec<String>>,
    pub(crate) slice_size: u32,
    pub(crate) slice_pause: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) max_consecutive_failures: u32,
}

impl std::ops::Deref for LogResolved {
    type Target = LogTables;

    fn deref(&self) -> &LogTables {
        &self.tables
    }
}
