//! The names a long-running job's state adds to a job table: progress and
//! checkpoints (`dbworker migration --progress`), waits and signals
//! (`--signals`). Fixed, like the other optional columns.

/// The job's public progress (`jsonb`): what `dbworker show` and the
/// dashboard show; kept when the job completes.
pub(crate) const PROGRESS: &str = "progress";
/// The job's private checkpoint (`jsonb`): what the next attempt resumes
/// from; dropped when the job completes.
pub(crate) const CHECKPOINT: &str = "checkpoint";
/// How many progress or checkpoint writes the job has had (`bigint`): every
/// write names the count it read, so none can land out of order.
pub(crate) const PROGRESS_SEQ: &str = "progress_seq";
/// The side table that keeps progress and checkpoints for a table without
/// the columns (`dbworker migration --progress-table`): `<table>_progress`,
/// in its schema, one row per job (`job_id` its primary key) with
/// `progress`, `checkpoint` and `progress_seq` as the columns would hold them.
pub(crate) fn progress_table(table: &super::Relation) -> super::Relation {
    super::Relation {
        schema: table.schema.clone(),
        name: table.derived("progress"),
        alias: "dbworker_progress".to_owned(),
    }
}

/// The largest progress or checkpoint stored, as JSON text.
pub(crate) const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// The trace context of the job's enqueue (`text`, W3C `traceparent`,
/// `dbworker migration --traces`): set by the enqueuer, or by the column's
/// default from the session setting `dbworker.traceparent`.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The enqueue's W3C `tracestate` (`text`), kept byte for byte.
pub(crate) const TRACESTATE: &str = "tracestate";
/// The span the job's next attempt follows (`text`, a `traceparent`): the
/// last attempt's, written by its fenced mark.
pub(crate) const TRACE_FOLLOWS: &str = "trace_follows";

/// The signal a waiting job waits for (`text`, `dbworker migration
/// --signals`); NULL when it waits for none.
pub(crate) const AWAITING: &str = "awaiting";

/// The mailbox of `table`'s signals: `<table>_signals`, in its schema.
pub(crate) fn signals_table(table: &super::Relation) -> super::Relation {
    super::Relation {
        schema: table.schema.clone(),
        name: table.derived("signals"),
        alias: "dbworker_signal".to_owned(),
    }
}
