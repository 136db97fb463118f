//! Records that carry a kind and a payload, which typed handlers read.

use workerutil::{Record, RecordId};

/// A record that carries its job's kind and payload: what a
/// [`JobHandler`](super::JobHandler) needs to pick the job and read its
/// arguments. [`TypedJob`] is one, ready-made; implement it for your own
/// record type to keep other columns beside them.
///
/// ```
/// use dbworker::ArgsRecord;
///
/// #[derive(Debug, sqlx::FromRow)]
/// struct Job { id: i64, tenant_id: i64, kind: String, payload: serde_json::Value }
///
/// impl workerutil::Record for Job {
///     fn id(&self) -> i64 { self.id }
/// }
///
/// impl ArgsRecord for Job {
///     fn kind(&self) -> &str { &self.kind }
///     fn payload(&self) -> &serde_json::Value { &self.payload }
/// }
/// ```
pub trait ArgsRecord: Record {
    /// The job's kind (its kind column).
    fn kind(&self) -> &str;

    /// The job's arguments as stored (its `jsonb` payload column).
    fn payload(&self) -> &serde_json::Value;
}

/// A ready-made record for typed jobs: the id, the kind and the payload.
///
/// Read with `sqlx::FromRow`, so a store reads it from a table with
/// `kind` and `payload` columns (`dbworker migration --typed`,
/// [`JobTableOptions::typed`](crate::JobTableOptions::typed)); under other
/// names a [`Client`](crate::Client) selects them as these by itself, and a
/// store of your own reads them through the table's `column_expressions`:
///
/// ```
/// // A table "tasks t" whose kind_column is "task_type" and payload_column
/// // "args".
/// let mut options = dbworker::JobTableOptions::new("tasks t");
/// options.kind_column = Some("task_type".into());
/// options.payload_column = Some("args".into());
/// options.column_expressions = vec![
///     "t.id".into(),
///     "t.task_type AS kind".into(),
///     "t.args AS payload".into(),
/// ];
/// ```
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
#[non_exhaustive]
pub struct TypedJob {
    /// The job's id.
    pub id: i64,
    /// The job's kind.
    pub kind: String,
    /// The job's arguments as stored.
    pub payload: serde_json::Value,
}

impl TypedJob {
    /// A record with these values (for tests of handlers).
    pub fn new(id: i64, kind: impl Into<String>, payload: serde_json::Value) -> TypedJob {
        TypedJob {
            id,
            kind: kind.into(),
            payload,
        }
    }
}

impl Record for TypedJob {
    fn id(&self) -> RecordId {
        self.id
    }
}

impl ArgsRecord for TypedJob {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
}
